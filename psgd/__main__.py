"""`python -m psgd ...`: the command-line entry point."""
from psgd.cli import main_and_exit

if __name__ == "__main__":
    main_and_exit()
