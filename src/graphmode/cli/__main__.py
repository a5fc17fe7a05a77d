from graphmode.cli.main import app

app()
