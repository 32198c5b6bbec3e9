"""Ray cluster definitions: the local development cluster helper, and YAMLs for the cluster
launcher (AWS) and KubeRay."""
