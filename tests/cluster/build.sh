#!/usr/bin/env bash
# Builds the real Kubernetes components the cluster tests run (etcd embedded
# in a main of ours, kube-apiserver, kube-scheduler, kube-controller-manager
# (run with the DaemonSet controller alone) and kubelet from
# k8s.io/kubernetes at the version go.mod pins, kubelet-oldest from the
# oldest supported minor kubelet-skew/go.mod pins, and recording-cri, the
# container runtime of ours kubelet talks to) and render-chart (Helm's library, a module of
# its own so that its pins do not move Kubernetes') into a cache outside the
# clone, keyed by the pins, the sources of ours and the Go version: a second
# run finds them and only prints where they are.
#
# Usage: tests/cluster/build.sh   (prints the directory of the binaries last)
# Env:   AMDGPU_CLUSTER_CACHE     cache root (default ~/.cache/amd-gpu-cluster)
#        GOMODCACHE, GOCACHE      Go's own caches (default: outside the clone)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

command -v go >/dev/null || { echo "build.sh: no 'go' on PATH (Go 1.26 is needed)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
key="$( { go version; cat build.sh; find . -name go.mod -o -name go.sum -o -name '*.go' | sort | xargs cat; } | sha256sum | cut -c1-16)"
root="${AMDGPU_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amd-gpu-cluster}"
out="$root/$key"
components=(etcd kube-apiserver kube-scheduler kube-controller-manager kubelet kubelet-oldest
    recording-cri render-chart)

complete() {
    for c in "${components[@]}"; do [ -x "$out/bin/$c" ] || return 1; done
}

if complete; then
    echo "$out/bin"
    exit 0
fi
mkdir -p "$root"
staging="$(mktemp -d "$root/.build-XXXXXX")"
trap 'rm -rf "$staging"' EXIT
start=$SECONDS
echo "build.sh: building ${components[*]} ($(go version | cut -d' ' -f3), key $key)" >&2
go mod download >&2
(cd render-chart && go mod download >&2)
(cd kubelet-skew && go mod download >&2)
echo "build.sh: modules ready after $((SECONDS - start)) s" >&2
# The version the binaries report (/version, the version skew checks), as
# Kubernetes' own build stamps it.
stamp() {
    local k8s minor v
    k8s="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
    minor="$(echo "$k8s" | cut -d. -f2)"
    v=k8s.io/component-base/version
    echo "-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
}
ldflags="$(stamp)"
go build -trimpath -ldflags "$ldflags" -o "$staging/bin/" \
    ./cmd/etcd ./cmd/recording-cri k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubelet >&2
(cd kubelet-skew && go build -trimpath -ldflags "$(stamp)" -o "$staging/bin/kubelet-oldest" \
    k8s.io/kubernetes/cmd/kubelet >&2)
(cd render-chart && go build -trimpath -ldflags "-s -w" -o "$staging/bin/render-chart" . >&2)
echo "build.sh: built in $((SECONDS - start)) s" >&2
# All or nothing: another build of the same key may have won the race.
if ! mv -T "$staging" "$out" 2>/dev/null; then
    complete || { echo "build.sh: $out exists but is incomplete; remove it" >&2; exit 1; }
fi
trap - EXIT
# Builds of older pins are ~200 MB each and never used again.
find "$root" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name '.build-*' -exec rm -rf {} +
echo "$out/bin"
