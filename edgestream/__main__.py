from edgestream.cli import main

main()
