// An example fleet that runs the agent: a Uniform Linux scale set (Ubuntu 22.04 LTS) behind a
// Standard internal load balancer whose health probe is the agent's /readyz, so a `drain`
// command takes a VM out of rotation without any control-plane permission. Terminate
// notifications give each VM a Scheduled Event (and time to drain) before it is deleted.
// The VMs have no public IP: outbound traffic (Service Bus, the package index) leaves through a
// NAT gateway, inbound traffic comes from the virtual network only.

targetScope = 'resourceGroup'

@description('Name of the scale set; the network resources are named after it.')
@minLength(1)
@maxLength(50)
param scaleSetName string

@description('Azure region.')
param location string

@description('Tags for every resource.')
param tags object

@description('Resource id of the agents\' user-assigned identity.')
param agentIdentityId string

@description('Client id of the agents\' user-assigned identity (AZURE_CLIENT_ID of the agent).')
param agentIdentityClientId string

@description('FQDN of the Service Bus namespace.')
param serviceBusNamespaceFqdn string

@description('MBRIDGE_COMMANDS_SHARDS: how many commands queues the commands are spread over; each agent derives its own queue from its VM\'s name and the count (wire/shards.py).')
@minValue(1)
@maxValue(1024)
param commandsShards int

@description('MBRIDGE_VERIFY_KEY: the Ed25519 public key commands must be signed with (one line: the raw key as base64). Required: the agents refuse to start without it on Service Bus.')
@minLength(1)
param agentVerifyKey string

@description('What install-agent.sh installs: the agent\'s artifact URL with its #sha256= (or, for pip, a pinned requirement or a wheel URL).')
param agentPackage string

@description('How long a VM being deleted may hold its Terminate event before Azure approves it (ISO 8601, 5 to 15 minutes).')
@allowed([
  'PT5M'
  'PT6M'
  'PT7M'
  'PT8M'
  'PT9M'
  'PT10M'
  'PT11M'
  'PT12M'
  'PT13M'
  'PT14M'
  'PT15M'
])
param terminateNotBeforeTimeout string

@description('Publish the VMs\' Scheduled Events to Event Grid and Azure Resource Graph too (scheduledEventsPolicy, Compute API 2025-04-01 or later; a preview that needs the SendScheduledEventsPolicy feature of Microsoft.Compute registered).')
param scheduledEventsToEventGrid bool

@description('Administrator user name (SSH key only, no password).')
param adminUsername string

@description('SSH public key of the administrator.')
param adminSshPublicKey string

@description('VM size (Gen2 images and Trusted Launch must be supported).')
param vmSize string

@description('Number of VMs.')
@minValue(1)
@maxValue(100)
param instanceCount int

@description('Encrypt temp disks and caches at the host; needs the subscription feature Microsoft.Compute/EncryptionAtHost.')
param encryptionAtHost bool

@description('Address space of the example virtual network.')
param addressPrefix string

@description('Subnet of the VMs and of the load balancer frontend.')
param subnetPrefix string

var loadBalancerName = '${scaleSetName}-lb'
var subnetName = 'agents'
var frontendName = 'frontend'
var backendPoolName = 'agents'
var probeName = 'agent-readyz'
var agentPort = 9797

// The agent's environment file (KEY=value lines), see docs/agent.md and docs/transports.md.
var agentEnvironment = join([
  'MBRIDGE_CLOUD=azure'
  'MBRIDGE_TRANSPORT=servicebus'
  'MBRIDGE_SERVICEBUS_NAMESPACE=${serviceBusNamespaceFqdn}'
  'AZURE_CLIENT_ID=${agentIdentityClientId}'
  'MBRIDGE_LISTEN=0.0.0.0:${agentPort}'
  'MBRIDGE_VERIFY_KEY=${agentVerifyKey}'
  'MBRIDGE_COMMANDS_SHARDS=${commandsShards}'
  ''
], '\n')
var installEnvironment = 'MBRIDGE_PACKAGE=${agentPackage}\n'

// infra/agent/cloud-init.yaml with its placeholders filled in (the files are read at build time).
// Only the quoted occurrences (the YAML strings) are replaced: a comment naming a placeholder
// never receives a second copy of a file, and the custom data stays under its 64 KB limit.
var cloudInitTemplate = loadTextContent('../../agent/cloud-init.yaml')
var withAgentEnvironment = replace(cloudInitTemplate, '"@@AGENT_ENV_B64@@"', format('"{0}"', base64(agentEnvironment)))
var withAgentUnit = replace(withAgentEnvironment, '"@@AGENT_UNIT_B64@@"', format('"{0}"', loadFileAsBase64('../../agent/mbridge-agent.service')))
var withInstallScript = replace(withAgentUnit, '"@@INSTALL_SCRIPT_B64@@"', format('"{0}"', loadFileAsBase64('../../agent/install-agent.sh')))
var cloudInit = replace(withInstallScript, '"@@INSTALL_ENV_B64@@"', format('"{0}"', base64(installEnvironment)))

resource networkSecurityGroup 'Microsoft.Network/networkSecurityGroups@2024-01-01' = {
  name: '${scaleSetName}-nsg'
  location: location
  tags: tags
  properties: {
    securityRules: [
      {
        name: 'allow-lb-probe-to-agent'
        properties: {
          description: 'The load balancer probes the agent\'s /readyz.'
          priority: 100
          direction: 'Inbound'
          access: 'Allow'
          protocol: 'Tcp'
          sourceAddressPrefix: 'AzureLoadBalancer'
          sourcePortRange: '*'
          destinationAddressPrefix: 'VirtualNetwork'
          destinationPortRange: string(agentPort)
        }
      }
      {
        // Overrides the default AllowAzureLoadBalancerInBound (65001), which allows every port.
        name: 'deny-lb-other-ports'
        properties: {
          description: 'The load balancer source reaches the agent port only.'
          priority: 4000
          direction: 'Inbound'
          access: 'Deny'
          protocol: '*'
          sourceAddressPrefix: 'AzureLoadBalancer'
          sourcePortRange: '*'
          destinationAddressPrefix: '*'
          destinationPortRange: '*'
        }
      }
    ]
  }
}

resource natPublicIp 'Microsoft.Network/publicIPAddresses@2024-01-01' = {
  name: '${scaleSetName}-nat-ip'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Regional'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
    publicIPAddressVersion: 'IPv4'
  }
}

// Outbound only: the VMs reach Service Bus and the package index without a public IP of their own.
resource natGateway 'Microsoft.Network/natGateways@2024-01-01' = {
  name: '${scaleSetName}-nat'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    idleTimeoutInMinutes: 4
    publicIpAddresses: [
      {
        id: natPublicIp.id
      }
    ]
  }
}

resource virtualNetwork 'Microsoft.Network/virtualNetworks@2024-01-01' = {
  name: '${scaleSetName}-vnet'
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    // Subnets inline: a redeployment of the network then never tries to delete them.
    subnets: [
      {
        name: subnetName
        properties: {
          addressPrefix: subnetPrefix
          networkSecurityGroup: {
            id: networkSecurityGroup.id
          }
          natGateway: {
            id: natGateway.id
          }
          defaultOutboundAccess: false
        }
      }
    ]
  }
}

resource subnet 'Microsoft.Network/virtualNetworks/subnets@2024-01-01' existing = {
  parent: virtualNetwork
  name: subnetName
}

resource loadBalancer 'Microsoft.Network/loadBalancers@2024-01-01' = {
  name: loadBalancerName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Regional'
  }
  properties: {
    frontendIPConfigurations: [
      {
        name: frontendName
        properties: {
          privateIPAllocationMethod: 'Dynamic'
          subnet: {
            id: subnet.id
          }
        }
      }
    ]
    backendAddressPools: [
      {
        name: backendPoolName
      }
    ]
    probes: [
      {
        // The agent's readiness: `drain` turns it unready, `restore` ready again.
        name: probeName
        properties: {
          protocol: 'Http'
          port: agentPort
          requestPath: '/readyz'
          intervalInSeconds: 5
          probeThreshold: 2
        }
      }
    ]
    loadBalancingRules: [
      {
        name: 'http'
        properties: {
          frontendIPConfiguration: {
            id: resourceId('Microsoft.Network/loadBalancers/frontendIPConfigurations', loadBalancerName, frontendName)
          }
          backendAddressPool: {
            id: resourceId('Microsoft.Network/loadBalancers/backendAddressPools', loadBalancerName, backendPoolName)
          }
          probe: {
            id: resourceId('Microsoft.Network/loadBalancers/probes', loadBalancerName, probeName)
          }
          protocol: 'Tcp'
          frontendPort: 80
          backendPort: 80
          enableFloatingIP: false
          idleTimeoutInMinutes: 4
        }
      }
    ]
  }
}

resource scaleSet 'Microsoft.Compute/virtualMachineScaleSets@2025-04-01' = {
  // checkov:skip=CKV_AZURE_97:Encryption at host needs a subscription feature registration, so it is the encryptionAtHost parameter (off by default so that the example deploys anywhere); disks are encrypted at rest with platform keys regardless.
  // checkov:skip=CKV_AZURE_95:No VM extension is installed (the agent comes with cloud-init); the OS image itself is upgraded automatically (automaticOSUpgradePolicy).
  name: scaleSetName
  location: location
  tags: tags
  sku: {
    name: vmSize
    tier: 'Standard'
    capacity: instanceCount
  }
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${agentIdentityId}': {}
    }
  }
  properties: {
    orchestrationMode: 'Uniform'
    // Overprovisioned VMs are deleted right after they boot: their agents would report noise.
    overprovision: false
    upgradePolicy: {
      // OS image upgrades go one VM at a time and wait for the probe (/readyz) to pass.
      mode: 'Rolling'
      rollingUpgradePolicy: {
        maxBatchInstancePercent: 50
        maxUnhealthyInstancePercent: 50
        maxUnhealthyUpgradedInstancePercent: 50
        pauseTimeBetweenBatches: 'PT1M'
      }
      automaticOSUpgradePolicy: {
        enableAutomaticOSUpgrade: true
        disableAutomaticRollback: false
      }
    }
    // The control plane's path: every VM's Scheduled Events also go to the subscription's Event Grid
    // system topic (Microsoft.ResourceNotifications.MaintenanceResources) and to Resource Graph
    // (maintenanceresources). The whole scale set shares one policy; during the preview the only
    // schema version is 2020-07-01 (Microsoft's "Scheduled Events in Event Grid" page).
    scheduledEventsPolicy: {
      scheduledEventsAdditionalPublishingTargets: {
        eventGridAndResourceGraph: {
          enable: scheduledEventsToEventGrid
          scheduledEventsApiVersion: '2020-07-01'
        }
      }
    }
    virtualMachineProfile: {
      osProfile: {
        computerNamePrefix: scaleSetName
        adminUsername: adminUsername
        customData: base64(cloudInit)
        linuxConfiguration: {
          disablePasswordAuthentication: true
          ssh: {
            publicKeys: [
              {
                path: '/home/${adminUsername}/.ssh/authorized_keys'
                keyData: adminSshPublicKey
              }
            ]
          }
          provisionVMAgent: true
        }
      }
      storageProfile: {
        imageReference: {
          publisher: 'Canonical'
          offer: '0001-com-ubuntu-server-jammy'
          sku: '22_04-lts-gen2'
          version: 'latest'
        }
        osDisk: {
          createOption: 'FromImage'
          caching: 'ReadWrite'
          managedDisk: {
            storageAccountType: 'StandardSSD_LRS'
          }
        }
      }
      networkProfile: {
        healthProbe: {
          id: '${loadBalancer.id}/probes/${probeName}'
        }
        networkInterfaceConfigurations: [
          {
            name: 'nic'
            properties: {
              primary: true
              ipConfigurations: [
                {
                  // No publicIPAddressConfiguration: the VMs get no public IP.
                  name: 'ipconfig'
                  properties: {
                    primary: true
                    subnet: {
                      id: subnet.id
                    }
                    loadBalancerBackendAddressPools: [
                      {
                        id: '${loadBalancer.id}/backendAddressPools/${backendPoolName}'
                      }
                    ]
                  }
                }
              ]
            }
          }
        ]
      }
      // A VM being deleted sees a Terminate Scheduled Event and may hold it this long.
      scheduledEventsProfile: {
        terminateNotificationProfile: {
          enable: true
          notBeforeTimeout: terminateNotBeforeTimeout
        }
      }
      securityProfile: {
        securityType: 'TrustedLaunch'
        uefiSettings: {
          secureBootEnabled: true
          vTpmEnabled: true
        }
        encryptionAtHost: encryptionAtHost
      }
      diagnosticsProfile: {
        bootDiagnostics: {
          enabled: true
        }
      }
    }
  }
}

output scaleSetName string = scaleSet.name
output loadBalancerName string = loadBalancer.name
output virtualNetworkName string = virtualNetwork.name
