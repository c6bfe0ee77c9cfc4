"""The trainer on this machine: `nvrx-eks local`, the run report, and the offline demo."""
