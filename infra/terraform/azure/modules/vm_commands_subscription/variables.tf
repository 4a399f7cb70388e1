variable "topic_id" {
  description = "Resource id of the commands topic (commands_mode = \"topic\"): /subscriptions/S/resourceGroups/G/providers/Microsoft.ServiceBus/namespaces/N/topics/maintenance-commands."
  type        = string

  validation {
    condition     = can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.ServiceBus/namespaces/[^/]+/topics/[^/]+$", var.topic_id))
    error_message = "topic_id must be a Service Bus topic's resource id."
  }
}

variable "events_topic_id" {
  description = "Resource id of the events topic (maintenance-events) the VM's agent publishes to with the same identity: Data Sender on it is granted here too. null: no role on the events topic (granted elsewhere)."
  type        = string
  default     = null

  validation {
    condition     = var.events_topic_id == null || can(regex("^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.ServiceBus/namespaces/[^/]+/topics/[^/]+$", var.events_topic_id))
    error_message = "events_topic_id must be null or a Service Bus topic's resource id."
  }
}

variable "vm_name" {
  description = "Name of the VM exactly as its Scheduled Events name it in Resources (the IMDS compute name): the commands' `target`, and the subscription's suffix (vm-<name>)."
  type        = string

  validation {
    # A subscription name takes 50 characters: "vm-" and at most 47 of the VM's name.
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,46}$", var.vm_name))
    error_message = "vm_name must be 1-47 letters, digits, '.', '_' or '-', starting with a letter or digit."
  }
}

variable "principal_id" {
  description = "Principal (object) id of the VM's own managed identity (system- or user-assigned): the only principal that may receive from the subscription."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.principal_id))
    error_message = "principal_id must be an object id (GUID)."
  }
}

variable "lock_duration" {
  description = "How long a received command stays locked for the agent (ISO 8601); it completes the command once it recorded what it did."
  type        = string
  default     = "PT1M"

  validation {
    condition     = contains(["PT30S", "PT1M", "PT2M", "PT5M"], var.lock_duration)
    error_message = "lock_duration must be PT30S, PT1M, PT2M or PT5M."
  }
}

variable "max_delivery_count" {
  description = "Deliveries of a command before Service Bus dead-letters it (a command the agent cannot settle)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_count >= 5 && var.max_delivery_count <= 100
    error_message = "max_delivery_count must be between 5 and 100."
  }
}
