// Stops a deployment with a message of ours. The caller passes 'ok', or a sentence saying what is
// wrong and how to fix it: ARM refuses a parameter value outside @allowed, and its error quotes
// the value it was given ("The provided value '<sentence>' for the template parameter 'outcome'
// is not valid ..."), so the sentence reaches whoever deploys (parameter validation:
// https://learn.microsoft.com/azure/azure-resource-manager/bicep/parameters#allowed-values).
//
// Bicep's own fail() (https://learn.microsoft.com/azure/azure-resource-manager/bicep/bicep-functions-flow-control,
// Bicep CLI 0.33.93 and later) would do this inside an expression, but the Bicep parser checkov
// pins (pycep-parser 0.5.1, with checkov 3.3.30 in `make infra`) cannot read it, and neither could
// tests/infra, which reads the Bicep with the same parser. This module deploys nothing.

targetScope = 'resourceGroup'

@description('\'ok\', or why the deployment must stop (the sentence the deployment error quotes).')
@allowed([
  'ok'
])
param outcome string
