"""Azure Functions entry point (Python v2 model): registers the blueprints, nothing else.

The control plane's path (functions/azure_app/central_blueprint.py) is registered when its queue is
configured (MBRIDGE_CENTRAL_QUEUE) or its reconciliation is on (MBRIDGE_CENTRAL_RECONCILE): the host
indexes the functions with the app settings in place.
"""

import os

import azure.functions as func

from functions.azure_app.blueprint import bp
from functions.azure_app.settings import central_functions

app = func.FunctionApp()
app.register_functions(bp)
if any(central_functions(os.environ)):
    from functions.azure_app.central_blueprint import blueprints

    for central_bp in blueprints(*central_functions(os.environ)):
        app.register_functions(central_bp)
