"""`python -m psgd ...`: the command-line entry point."""
from psgd.cli import main

if __name__ == "__main__":
    main()
