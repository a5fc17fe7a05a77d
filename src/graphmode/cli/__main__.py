from graphmode.cli.main import run

run()
