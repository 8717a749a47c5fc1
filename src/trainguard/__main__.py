from trainguard.cli.main import entry

entry()
