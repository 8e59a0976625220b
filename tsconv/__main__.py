from tsconv.cli import main

main()
