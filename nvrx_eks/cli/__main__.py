"""`python -m nvrx_eks.cli`: the entry point of the `nvrx-eks` script."""

from nvrx_eks.cli import main

if __name__ == "__main__":
    main()
