// Package kubernetes checks pegad's Kubernetes deployment offline: its
// tests render the Helm chart (deploy/helm/pegad) with Helm's own Go
// packages, decode every object strictly into its k8s.io/api (or
// Prometheus Operator) type, and check what the daemon needs of the pod
// against pegad's own configuration code. The plain manifests beside it
// (pegad.yaml, and pegad-monitoring.yaml for the Prometheus Operator) are
// the chart rendered with its defaults, and examples/vllm.yaml is an
// engine that uses the node's pegad. The images (deploy/image) are parsed
// with BuildKit's Dockerfile parser and checked against the repository,
// the chart and the Makefile.
//
// It is a module of its own so that Helm, BuildKit and the Kubernetes API
// packages stay out of the pegad module and its binaries. It holds no
// code that ships: only this comment and tests.
package kubernetes
