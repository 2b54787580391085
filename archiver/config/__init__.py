"""The configuration room: the option table, commands' own options, values parsed into `Settings`, input bounds."""
