"""Hand-over to the dlrecipes CLI, so that Composer's launcher can start it as a script:

composer -n 8 cli.py train recipes/imagenet100_fast.yaml
"""

from dlrecipes.cli import main

if __name__ == "__main__":
    main()
