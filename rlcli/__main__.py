from rlcli.cli import main

main()
