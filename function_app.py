"""Azure Functions entry point (Python v2 model): registers the blueprints, nothing else.

The control plane's path (functions/azure_app/central_blueprint.py) is registered when its queue is
configured (MBRIDGE_CENTRAL_QUEUE): the host indexes the functions with the app settings in place.
"""

import os

import azure.functions as func

from functions.azure_app.blueprint import bp
from functions.azure_app.settings import CENTRAL_QUEUE

app = func.FunctionApp()
app.register_functions(bp)
if os.environ.get(CENTRAL_QUEUE):
    from functions.azure_app.central_blueprint import central_bp

    app.register_functions(central_bp)
