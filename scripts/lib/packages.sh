# shellcheck shell=bash
# Installs the groups of scripts/packages.txt that are missing, with one apt-get update.
# Usage (sourced): ensure_packages build test

ensure_packages() {
  local list want group package check _why need=()
  list="$(dirname "${BASH_SOURCE[0]}")/../packages.txt"
  for want in "$@"; do
    while read -r group package check _why; do
      case "$group" in ''|'#'*) continue ;; esac
      [ "$group" = "$want" ] || continue
      case "$check" in
        cmd:*) command -v "${check#cmd:}" >/dev/null 2>&1 && continue ;;
        file:*) [ -e "${check#file:}" ] && continue ;;
        *) echo "packages.txt: bad check '$check' for $package" >&2; return 1 ;;
      esac
      need+=("$package")
    done <"$list"
  done
  [ ${#need[@]} -gt 0 ] || return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${need[*]} (Debian package names; see README, 'Other systems')" >&2
    return 1
  fi
  printf '==> installing %s\n' "${need[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
}
