"""What each training framework can run, and how its files are written."""
