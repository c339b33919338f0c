"""``python -m shoal.cli``: the same as the ``shoal`` command."""

from shoal.cli import main

if __name__ == "__main__":
    main()
