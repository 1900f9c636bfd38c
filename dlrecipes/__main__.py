from dlrecipes.cli import main

main()
