// Package deploy holds the Kubernetes example, deploy/kubernetes.yaml. No
// cluster runs it here, so its tests decode it strictly and check what the
// README says of it and what idemproxy needs from it; the compose
// examples at the repository's root are run by imagetest and only their
// variables are checked here. It has only tests.
package deploy
