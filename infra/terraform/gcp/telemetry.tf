# Telemetry (var.telemetry, docs/operations.md#telemetry): with gcp, each invocation of the functions
# is a span in Cloud Trace and metric points in Cloud Monitoring, which the function's runtime account
# writes (function_telemetry, iam.tf) and whose APIs take them (main.tf). Off, the default, neither
# role is granted nor API enabled, and MBRIDGE_TELEMETRY=off loads nothing of OpenTelemetry.
locals {
  telemetry_on    = var.telemetry == "gcp"
  telemetry_apis  = local.telemetry_on ? ["cloudtrace.googleapis.com", "monitoring.googleapis.com"] : []
  telemetry_roles = toset(local.telemetry_on ? ["roles/cloudtrace.agent", "roles/monitoring.metricWriter"] : [])
}
