"""Azure Functions entry point (Python v2 model): registers the blueprints, nothing else."""

import azure.functions as func

from functions.azure_app.blueprint import bp

app = func.FunctionApp()
app.register_functions(bp)
