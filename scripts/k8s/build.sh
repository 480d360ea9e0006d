#!/usr/bin/env bash
# Builds the Kubernetes and CSI test tools from the Go module proxy into one cache directory,
# so a second run is quick: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
# and kubectl (v1.33, through the wrapper module beside this script), csi-sanity, helm and
# kubeconform, the VolumeSnapshot CRDs (external-snapshotter's client module, into
# bin/snapshot-crds), and the S3 server of the backup tests (SeaweedFS, `weed`, through the
# wrapper module in scripts/s3). Prints the bin directory on its last line.
#
# HAWSER_K8S_CACHE (default ~/.cache/hawser-k8s) holds GOMODCACHE, GOCACHE and bin/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${HAWSER_K8S_CACHE:-$HOME/.cache/hawser-k8s}"
bin="$cache/bin"
mkdir -p "$bin"
export GOMODCACHE="$cache/gomod" GOCACHE="$cache/gobuild" GOFLAGS=-modcacherw GOTOOLCHAIN=local
# Go may be installed without being on PATH (the usual /usr/local/go).
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "go not found: install Go 1.24 or newer" >&2; exit 1; }

K8S_VERSION=v1.33.13
CSI_TEST_VERSION=v5.6.0
HELM_VERSION=v3.18.4
KUBECONFORM_VERSION=v0.7.0
SNAPSHOT_CLIENT_VERSION=v8.2.0

# A stamp per tool set: a changed version rebuilds, an unchanged one is skipped.
built() { [ -f "$bin/.stamp-$1" ] && [ "$(cat "$bin/.stamp-$1")" = "$2" ]; }
stamp() { echo "$2" >"$bin/.stamp-$1"; }

if ! built k8s "$K8S_VERSION"; then
  echo "building Kubernetes $K8S_VERSION (several minutes on a cold cache)" >&2
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  pkg=k8s.io/component-base/version
  cpkg=k8s.io/client-go/pkg/version
  ld="-s -w"
  for p in $pkg $cpkg; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  (cd "$here" && go build -trimpath -ldflags "$ld" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubectl)
  stamp k8s "$K8S_VERSION"
fi

gobin() {
  local name=$1 version=$2 pkg=$3
  built "$name" "$version" && return 0
  echo "building $name $version" >&2
  GOBIN="$bin" go install "$pkg@$version"
  stamp "$name" "$version"
}
gobin csi-sanity "$CSI_TEST_VERSION" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
gobin helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
gobin kubeconform "$KUBECONFORM_VERSION" github.com/yannh/kubeconform/cmd/kubeconform
if ! built snapshot-crds "$SNAPSHOT_CLIENT_VERSION"; then
  dir="$(cd "$cache" && go mod download -json \
    "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOT_CLIENT_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [ -d "$dir/config/crd" ] || { echo "no CRDs in external-snapshotter client module" >&2; exit 1; }
  mkdir -p "$bin/snapshot-crds"
  cp "$dir"/config/crd/snapshot.storage.k8s.io_*.yaml "$bin/snapshot-crds/"
  stamp snapshot-crds "$SNAPSHOT_CLIENT_VERSION"
fi

# SeaweedFS (Apache-2.0): `go install ...@version` is refused because its go.mod has a
# replace directive, so it is built as a dependency of the small wrapper module in
# scripts/s3 (go.mod and go.sum pin every dependency; tools.go imports it).
s3_mod="$here/../s3"
WEED_VERSION="$(sed -n 's|^require github.com/seaweedfs/seaweedfs \(.*\)$|\1|p' "$s3_mod/go.mod")"
[ -n "$WEED_VERSION" ] || { echo "no seaweedfs version in $s3_mod/go.mod" >&2; exit 1; }
if ! built weed "$WEED_VERSION" || [ ! -x "$bin/weed" ]; then
  echo "building SeaweedFS $WEED_VERSION (about 4 minutes on a cold cache)" >&2
  (cd "$s3_mod" && GOFLAGS="$GOFLAGS -mod=readonly" go build -trimpath -ldflags "-s -w" \
    -o "$bin/weed" github.com/seaweedfs/seaweedfs/weed)
  stamp weed "$WEED_VERSION"
fi
echo "$bin"
