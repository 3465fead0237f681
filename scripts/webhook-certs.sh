#!/usr/bin/env bash
# The admission webhook's certificate, then its configuration.
#
#   scripts/webhook-certs.sh                 a CA of its own (openssl) signs
#                                            the serving certificate, in the
#                                            Secret switchyard-webhook-tls
#   scripts/webhook-certs.sh --cert-manager  cert-manager issues them
#                                            (config/kubernetes/webhook-cert-manager.yaml)
#   scripts/webhook-certs.sh --out DIR       only writes ca.crt, tls.crt, tls.key
#
# Then it waits until the webhook's Deployment is available and applies
# config/kubernetes/webhook-configuration.yaml with the CA as its caBundle:
# the API server sends pods to the webhook only once it answers, so no pod
# is refused for want of it. Apply config/kubernetes (kubectl apply -k)
# first. Run it again to renew: the configuration then trusts the new CA
# and the one before it (set before the Secret changes), so the replicas
# are trusted while the kubelet updates their Secret volume and the webhook
# reloads the certificate files.
set -euo pipefail
ns=switchyard-system
svc=switchyard-webhook
days=825
here="$(cd "$(dirname "$0")" && pwd)"
config="$here/../config/kubernetes"
out=""
mode=openssl
case "${1:-}" in
  --out) out="${2:?--out needs a directory}"; mkdir -p "$out" ;;
  --cert-manager) mode=cert-manager ;;
  "") ;;
  *) echo "usage: $0 [--cert-manager | --out DIR]" >&2; exit 2 ;;
esac

# The configuration with $ca_bundle (base64 PEM) under clientConfig.
configure() {
  [ -n "$ca_bundle" ] || { echo "$0: no CA for caBundle" >&2; exit 1; }
  local manifest
  manifest="$(sed "s|^\( *\)clientConfig:\$|&\n\1  caBundle: $ca_bundle|" \
    "$config/webhook-configuration.yaml")"
  grep -qF "caBundle: $ca_bundle" <<<"$manifest" ||
    { echo "$0: no clientConfig line in webhook-configuration.yaml to put caBundle under" >&2; exit 1; }
  printf '%s\n' "$manifest" | kubectl apply -f -
}

if [ "$mode" = cert-manager ]; then
  kubectl apply -f "$config/webhook-cert-manager.yaml"
  kubectl -n "$ns" wait --for=condition=Ready "certificate/$svc" --timeout=300s
  ca_bundle="$(kubectl -n "$ns" get secret "$svc-tls" -o 'jsonpath={.data.ca\.crt}')"
else
  dir="${out:-$(mktemp -d)}"
  [ -n "$out" ] || trap 'rm -rf "$dir"' EXIT
  openssl req -x509 -newkey rsa:2048 -nodes -days "$days" \
    -subj "/CN=switchyard-webhook CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$svc.$ns.svc" \
    -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
  cat > "$dir/ext.cnf" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local
EXT
  openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days "$days" -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
  rm -f "$dir/tls.csr" "$dir/ext.cnf" "$dir/ca.srl"
  if [ -n "$out" ]; then
    rm -f "$dir/ca.key"
    echo "wrote $dir/ca.crt $dir/tls.crt $dir/tls.key"
    exit 0
  fi
  # A renewal: the new CA and the newest one the configuration trusts now.
  previous="$(kubectl get mutatingwebhookconfiguration switchyard-network-resources \
    -o 'jsonpath={.webhooks[0].clientConfig.caBundle}' 2>/dev/null | base64 -d |
    awk '/BEGIN CERTIFICATE/ { n++ } n == 1')" || previous=""
  ca_bundle="$( { cat "$dir/ca.crt"; [ -z "$previous" ] || printf '%s\n' "$previous"; } | base64 -w0)"
  [ -z "$previous" ] || configure
  kubectl -n "$ns" create secret tls "$svc-tls" --cert="$dir/tls.crt" --key="$dir/tls.key" \
    --dry-run=client -o yaml | kubectl apply -f -
fi

# The webhook serves with the certificate once a replica is available.
kubectl -n "$ns" rollout status "deployment/$svc" --timeout=300s
configure
echo "Secret $ns/$svc-tls in place; the webhook is configured"
