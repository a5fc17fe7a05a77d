# shellcheck shell=bash
# Sourced by the chains before they start anything in the background: on a host that is new since the bundle
# calls (the device reply said "warm": false) the site dir is gone, and a chain started there failed its first
# step with an import traceback in a log (lease 10). Fail in the call itself, saying why.
# usage: gm_preflight SITE PYTHON SRC_DIR
gm_preflight() {
  local site="$1" py="$2" src="$3" err
  if err=$(PYTHONPATH="$site:$src" "$py" -c 'import graphmode.cli.profile_cmd' 2>&1); then return 0; fi
  echo "preflight: graphmode does not import with $py and GM_SITE=$site: $(printf '%s\n' "$err" | tail -n 1)" >&2
  if [ ! -d "$site" ]; then
    echo "preflight: no $site on this host: a host that is new since the bundle calls (\"warm\": false) has none" \
      "of the bundle; make the bundle calls again (.gpu/calls.txt)" >&2
  fi
  return 3
}
