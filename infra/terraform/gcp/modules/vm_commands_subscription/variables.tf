variable "project_id" {
  description = "Project of the commands topic and of the subscription."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a project ID."
  }
}

variable "vm_name" {
  description = "Name of the VM, exactly as its metadata server reports it: the agent's `target`, and the subscription's suffix."
  type        = string

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.vm_name))
    error_message = "vm_name must be a Compute instance name: lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "commands_topic_id" {
  description = "The commands topic, projects/P/topics/maintenance-commands."
  type        = string

  validation {
    condition     = can(regex("^projects/[^/]+/topics/[^/]+$", var.commands_topic_id))
    error_message = "commands_topic_id must be a topic id: projects/P/topics/T."
  }
}

variable "agent_service_account_email" {
  description = "Service account of this VM's agent; it alone may pull from the subscription."
  type        = string

  validation {
    condition     = can(regex("^[^@]+@[^@]+\\.iam\\.gserviceaccount\\.com$", var.agent_service_account_email))
    error_message = "agent_service_account_email must be a service account email (…@….iam.gserviceaccount.com)."
  }
}

variable "ack_deadline_seconds" {
  description = "Seconds the agent has to settle a pulled command before Pub/Sub delivers it again. The agent neither extends deadlines nor settles before it has recorded what it did (docs/transports.md)."
  type        = number
  default     = 60

  validation {
    condition     = var.ack_deadline_seconds >= 10 && var.ack_deadline_seconds <= 600
    error_message = "ack_deadline_seconds must be between 10 and 600."
  }
}

variable "message_retention_duration" {
  description = "How long an undelivered command is kept. Commands expire 10 minutes after they are issued; Pub/Sub's minimum is 600s."
  type        = string
  default     = "900s"

  validation {
    condition     = can(regex("^[0-9]+s$", var.message_retention_duration)) && try(tonumber(trimsuffix(var.message_retention_duration, "s")) >= 600 && tonumber(trimsuffix(var.message_retention_duration, "s")) <= 1200, false)
    error_message = "message_retention_duration must be between 600s and 1200s, written like 900s."
  }
}

variable "dead_letter_topic_id" {
  description = "Optional dead-letter topic for commands delivered max_delivery_attempts times without being settled. The Pub/Sub service agent must be publisher on it (granted by the caller); this module grants it subscriber on the subscription."
  type        = string
  default     = null

  validation {
    condition     = var.dead_letter_topic_id == null || can(regex("^projects/[^/]+/topics/[^/]+$", var.dead_letter_topic_id))
    error_message = "dead_letter_topic_id must be null or projects/P/topics/T."
  }
}

variable "max_delivery_attempts" {
  description = "Deliveries before a command goes to dead_letter_topic_id (ignored without one)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts must be between 5 and 100."
  }
}

variable "pubsub_service_agent_email" {
  description = "service-<project number>@gcp-sa-pubsub.iam.gserviceaccount.com; needed only with dead_letter_topic_id."
  type        = string
  default     = null
}
