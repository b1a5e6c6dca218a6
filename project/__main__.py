from project.cli import main

main()
