"""`rayfed report`: tables and plots over run or sweep directories, averaged over seeds per group of
configs; on a sweep, its selected settings or its whole grid."""
