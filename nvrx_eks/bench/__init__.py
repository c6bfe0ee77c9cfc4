"""`nvrx-eks bench`: resilience scenarios run side by side, their analysis, charts, and floors."""
