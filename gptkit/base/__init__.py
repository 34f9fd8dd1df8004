"""What every part stands on: errors a user can cause, settings from config files and the command line, locks and
stop signals."""
