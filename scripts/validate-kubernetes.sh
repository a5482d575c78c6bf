#!/bin/sh
# Validates deploy/kubernetes against the Kubernetes API schemas (kubernetes-validate from PyPI,
# into a venv under .build/, offline once installed). Usage: scripts/validate-kubernetes.sh [FILE…]
set -eu
venv=.build/kubernetes-venv
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate
fi
[ $# -gt 0 ] || set -- deploy/kubernetes/*.yaml
# kustomization.yaml is kustomize's, not the API server's.
for file in "$@"; do
  case "$file" in *kustomization.yaml) continue ;; esac
  "$venv/bin/kubernetes-validate" --strict --kubernetes-version 1.30 "$file"
done
