"""`rayfed report`: tables and plots over run directories, averaged over seeds per group of configs."""
