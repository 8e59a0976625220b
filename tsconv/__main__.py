from tsconv.cli import run

run()
