"""The ``advisor`` command: click commands, the shared plan options, and rendering."""
