#!/usr/bin/env bash
# Guard for issue 40: `make test` must provide every tool its tests use, on a fresh machine.
# A warm cache (~/.cache/hawser-k8s) once hid a Makefile that built none of the Kubernetes
# tools, so this reads the sources, not the machine. It checks that
#   - each tool the tests look up (in the Rust sources, and in the scripts that they and make
#     test run) has a provider: the Makefile's NEEDED_CMDS (the deps step), what
#     scripts/k8s/build.sh builds, ui/package.json (npm ci), the guest kernel that
#     `scripts/kvm/boot.sh --prepare` prepares (make kvm-kernel; run_in_guest needs it),
#     Debian's required packages, or HOST_CMDS;
#   - `make -n -B test`, as on a fresh machine, runs each provider's step before the tests;
#   - each "missing tool" message names a step that really provides the tool, and each
#     message about a missing guest kernel names make kvm-kernel, a step of make test.
# Last, so that a fresh machine stops at once rather than after the long build: the commands
# make test needs but cannot install (HOST_CMDS) are on this machine.
# One line per problem and exit status 1 if any. `make test` runs it first (make check-tools);
# with --list it also prints every look-up and its provider.
# shellcheck disable=SC2016 # the regexes and make expressions below mean a literal $
set -euo pipefail
cd "$(dirname "$0")/.."
# Without git there would be no sources to read, and nothing to fail on.
git rev-parse --is-inside-work-tree >/dev/null

problems=0
problem() { echo "check-tools: $*" >&2; problems=$((problems + 1)); }
# make without a calling make's flags (-j's jobserver, -k, command-line variables). A dry run
# still runs the recipe lines that name $(MAKE), with test-times.sh after them: their times go
# nowhere, not into the run's log.
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL HAWSER_TEST_TIMES=/dev/null make --no-print-directory "$@"; }
# A Makefile variable as make sees it, so that no list is copied here.
mkvar() { mk -s --eval 'print-var-%: ; @echo $($*)' "print-var-$1"; }

# --- Providers: prov[KIND:NAME] = the step that provides it ---------------------------------
declare -A prov=()
# A program off PATH is named there by its path (Debian's PostgreSQL); the tests name it by
# its last part (pg_bin("initdb")).
for c in $(mkvar NEEDED_CMDS); do prov[cmd:${c##*/}]=deps; done
for c in $(mkvar HOST_CMDS); do prov[cmd:$c]=host; done
# Commands of Debian's "required" packages (coreutils, bash, dash, mount, util-linux,
# e2fsprogs, apt, dpkg, gzip), which every Debian system has. Add one only if `dpkg-query -W
# -f '${Priority}' PACKAGE` says required.
for c in sh bash echo true sleep sync sha256sum mount umount losetup nsenter setsid blkid \
  e2fsck fsck.ext4 dumpe2fs resize2fs setpriv apt-get dpkg-deb gzip blockdev dd df du stat; do
  prov[cmd:$c]=base
done
APT_PACKAGES=" $(mkvar APT_PACKAGES) "
# What a script builds into the Kubernetes tools cache: the Kubernetes commands, `gobin NAME`
# and "$bin/NAME" (scripts/k8s/build.sh).
built_by() {
  { grep -oE 'k8s\.io/kubernetes/cmd/[a-z-]+' "$1" | sed 's|.*/||'
    sed -nE 's/^gobin ([a-z-]+) .*/\1/p; s|.*"\$bin/([a-z][a-z-]*).*|\1|p' "$1"; } | sort -u
}
for t in $(built_by scripts/k8s/build.sh); do prov[k8s:$t]=k8s-tools; done
while read -r p; do prov[npm:$p]=npm-ci; done < <(
  sed -nE '/"(dev)?[dD]ependencies"/,/}/ s/^ *"([^"]+)": .*/\1/p' ui/package.json)
# The guest kernel and initramfs in ~/.cache/hawser-kvm, which scripts/kvm/boot.sh boots and
# never prepares itself (make kvm-kernel runs it with --prepare).
prov[kvm:guest-kernel]=kvm-kernel

# --- What `make test` runs on a fresh machine: no cache (an empty HOME) and nothing built
# (-B: a fresh clone has no ui/node_modules, so its npm ci shows even where one exists).
fresh_home=$(mktemp -d)
trap 'rm -rf "$fresh_home"' EXIT
MAKE_N=$(HOME=$fresh_home mk -n -B test)

# --- What the tests look up: "KIND NAME FILE" lines ----------------------------------------
# matches ERE FILES...: "FILE<tab>MATCH" for every match, each file read as one line (so a
# call rustfmt split over lines still matches). ENVIRON: awk -v would eat the backslashes.
matches() {
  RE=$1 awk 'BEGIN { RS = "\001"; re = ENVIRON["RE"] } { gsub(/[ \t\n]+/, " "); s = $0
    while (match(s, re)) { print FILENAME "\t" substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH) } }' \
    "${@:2}"
}
# names KIND all|last|word: the quoted names of each match (every one, or the last one), or
# the first word of its quoted command line.
names() {
  awk -F'\t' -v k="$1" -v m="$2" '{ n = split($2, q, "\"")
    if (m == "all") { for (i = 2; i < n; i += 2) print k, q[i], $1 }
    else if (m == "last") print k, q[n - 1], $1
    else { split(q[2], w, " "); print k, w[1], $1 } }'
}
rust_lookups() {
  local files funcs
  mapfile -t files < <(git ls-files 'crates/*.rs')
  # Command::new("ps"), and the helpers that take a program (`fn have(bin: &str)`, skip,
  # run_ok, tool_works, ...) called with a name: have("fio"), mounts::run("losetup", ...).
  funcs=$(matches 'fn [a-z_]+\((program|prog|bin|cmd|tool): &str' "${files[@]}" |
    sed -E 's/.*\tfn ([a-z_]+)\(.*/\1/' | sort -u | paste -sd'|')
  matches '(^|[^a-z_])('"$funcs"')\("[A-Za-z0-9._+-]+"|Command::new\("[A-Za-z0-9._+-]+"\)' "${files[@]}" |
    names cmd last
  # need(&["fio", ...]) and `for bin in ["ip", "iptables"] { if !have(bin)`
  matches 'need\(&\[[^]]*\]|for [a-z_]+ in \[[^]]*\] \{ if !have\(' "${files[@]}" | names cmd all
  # sh("ip netns list"), sh(&format!("fusermount3 -u {d} ..."))
  matches '[^a-z_]sh\(&?(format!\( ?)?"[A-Za-z0-9._+-]+ ' "${files[@]}" | names cmd word
  matches 'Path::new\("/usr/s?bin/[^"]+"\)' "${files[@]}" | names cmd last | sed -E 's|/usr/s?bin/||'
  # The Kubernetes tools cache: k8s_tool("helm"), k8s_bin_dir().join("kubectl"), K8S_BIN.
  matches '(k8s_tool\(|k8s_bin_dir\(\) ?\.join\(|K8S_BIN"\)\) ?\.join\()"[^"]+"' "${files[@]}" |
    names k8s last
  matches 'node_modules/(@[a-z0-9._-]+/)?[a-z0-9][a-z0-9._-]*' "${files[@]}" | sed -E 's|^(.*)\tnode_modules/(.*)|npm \2 \1|'
  # A command in the real-kernel guest: run_in_guest("name", ...) (crates/hawser-e2e/src/guest.rs).
  matches 'run_in_guest\("' "${files[@]}" | sed -E 's/^(.*)\t.*/kvm guest-kernel \1/'
}
# The scripts that make test and the tests run (k8s.rs: scripts_dir().join("up.sh")); what
# each checks for itself: `command -v X`, `for c in LIST; do command -v $c`, and "$BIN/X"
# (up.sh's name for the Kubernetes tools cache).
script_lookups() {
  local s scripts
  scripts=$( { grep -oE 'scripts/[A-Za-z0-9/_-]+\.sh' <<<"$MAKE_N"
    for s in $(git grep -hoE 'join\("[a-z0-9_-]+\.sh"\)' -- 'crates/*.rs' | cut -d'"' -f2); do
      git ls-files "scripts/$s" "scripts/*/$s"
    done; } | grep -vx scripts/check-tools.sh | sort -u || true)
  [ -n "$scripts" ] || return 0
  # shellcheck disable=SC2086 # a list of paths without spaces
  { matches 'command -v [A-Za-z0-9._+-]+' $scripts | sed -E 's/(.*)\tcommand -v (.*)/cmd \2 \1/'
    matches 'for [a-z]+ in [^;]*; do command -v "?\$' $scripts |
      awk -F'\t' '{ n = split($2, w, /[ ;]/); for (i = 4; i <= n && w[i] != "do"; i++) if (w[i] != "") print "cmd", w[i], $1 }'
    matches '"\$BIN/[a-z][a-z-]*' $scripts | sed -E 's|(.*)\t"\$BIN/(.*)|k8s \2 \1|'; }
}
LOOKUPS=$( { rust_lookups; script_lookups; } | sort -u)

# --- Each look-up has a provider ---------------------------------------------------------
declare -A used=()
while read -r kind name file; do
  p=${prov[$kind:$name]:-}
  [ "${1:-}" != --list ] || printf '%-4s %-24s %-10s %s\n' "$kind" "$name" "${p:--}" "$file"
  if [ -n "$p" ]; then used[$p]=1; continue; fi
  case $kind in
    cmd) problem "$file needs \`$name\`, which no make test step provides: add its Debian" \
           "package to APT_PACKAGES and \`$name\` to NEEDED_CMDS in the Makefile" ;;
    k8s) problem "$file looks up $name in the Kubernetes tools cache, which" \
           "scripts/k8s/build.sh does not build: build it there" ;;
    npm) problem "$file needs ui/node_modules/$name, not in ui/package.json: npm install -D it" ;;
    kvm) problem "$file needs $name, which no make test step provides" ;;
  esac
done <<<"$LOOKUPS"

# --- make test runs each provider before its tests ---------------------------------------
# The first line that runs tests: `cargo test` or `cargo nextest run`, but not a build of test
# binaries (`cargo test --no-run`, among the builds).
first_test=$(grep -nE '(^|[ /])cargo (test|nextest run) ' <<<"$MAKE_N" | grep -v -- '--no-run' |
  head -1 | cut -d: -f1 || true)
# runs REGEX TARGET WHAT: else name the targets whose recipe has it.
runs() {
  local at where
  at=$(grep -nE "$1" <<<"$MAKE_N" | head -1 | cut -d: -f1 || true)
  [ -n "$at" ] && [ "$at" -lt "${first_test:-999999}" ] && return
  where=$(awk -v re="$1" '/^[^\t#][^:=]*:([^=]|$)/ { t = $1 } /^\t/ && $0 ~ re { print t }' Makefile |
    tr -d : | sort -u | paste -sd' ')
  problem "make test (make -n -B test, HOME empty) does not run \`$1\` before its tests, so" \
    "nothing provides $3: make $2 a prerequisite of test, with it in $2's recipe (the" \
    "Makefile has it in the recipe of: ${where:-no target})"
}
[ -z "${used[deps]:-}" ] || runs 'apt-get install' deps "the Debian packages (NEEDED_CMDS)"
[ -z "${used[k8s-tools]:-}" ] || runs 'scripts/k8s/build.sh' k8s-tools \
  "the Kubernetes tools ($(built_by scripts/k8s/build.sh | tr '\n' ' '| sed 's/ $//'))"
[ -z "${used[npm-ci]:-}" ] || runs 'npm ci' '$(UI_MODULES)' "ui/node_modules"
[ -z "${used[kvm-kernel]:-}" ] || runs 'scripts/kvm/boot.sh --prepare' kvm-kernel \
  "the guest kernel of run_in_guest"
# cargo-fuzz: scripts/fuzz.sh installs it and is its only user, so it only has to run.
grep -q 'scripts/fuzz.sh' <<<"$MAKE_N" || problem "make test does not run scripts/fuzz.sh"

# --- Each "missing tool" message names a step that provides the tool --------------------
declare -A target_ok=()
while IFS=: read -r file _ msg; do
  # "no {name} at ...: run scripts/k8s/build.sh (make test does)": make test runs that script
  # and it builds the tool named ({name}: every tool looked up in the cache).
  script=$(grep -oE 'run scripts/[A-Za-z0-9/_-]+\.sh \(make test does' <<<"$msg" | cut -d' ' -f2 || true)
  if [ -n "$script" ]; then
    grep -qwF "$script" <<<"$MAKE_N" || problem "$file says make test runs $script; it does not"
    tools=$(sed -nE 's/.*no ([A-Za-z0-9._-]+|\{[a-z]+\}) at.*/\1/p' <<<"$msg")
    [[ $tools != "{"* ]] || tools=$(awk '$1 == "k8s" { print $2 }' <<<"$LOOKUPS" | sort -u)
    absent=$(grep -vxF -f <(built_by "$script") <<<"$tools" | paste -sd' ' || true)
    [ -z "$absent" ] || problem "$file says $script builds $absent; it does not"
  fi
  # "(make deps installs it)": make test does all that make deps does.
  for target in $(grep -oE 'make [a-z-]+ (does|installs)' <<<"$msg" | cut -d' ' -f2 || true); do
    [ "$target" != test ] || continue
    if [ -z "${target_ok[$target]:-}" ]; then
      target_ok[$target]=yes
      if HOME=$fresh_home mk -n -B "$target" | grep -vxF -f <(echo "$MAKE_N") | grep -q .; then
        target_ok[$target]=no
      fi
    fi
    [ "${target_ok[$target]}" = yes ] || problem "$file names make $target, which make test does not do"
  done
  # "(make test installs ...)": the tools it names (or, with a placeholder, all its file runs)
  # are installed by a step, not merely expected (HOST_CMDS); packages it names are installed.
  [[ $msg == *installs* ]] || continue
  mine=$(awk -v f="$file" '$1 == "cmd" && $3 == f { print $2 }' <<<"$LOOKUPS")
  tools=$(tr -cs 'A-Za-z0-9._/+-' '\n' <<<"$msg" | sed 's|.*/||' | grep -xF -f <(echo "$mine") || true)
  [ -n "$tools" ] || [[ $msg != *"{"* ]] || tools=$mine
  for t in $tools; do
    case ${prov[cmd:$t]:-} in
      deps | base) ;;
      *) problem "$file says make test installs $t; it does not" ;;
    esac
  done
  for pkg in $(sed -nE 's/.*installs ([^)]*)\).*/\1/p' <<<"$msg" | tr ' ' '\n' | grep -vxE 'it|them|and' || true); do
    [[ $APT_PACKAGES == *" $pkg "* ]] || problem "$file says make test installs $pkg; APT_PACKAGES lacks it"
  done
done < <(git grep -nE '(make [a-z-]+|the Makefile) (does|installs)' -- 'crates/*.rs')

# --- Each message about a missing guest kernel names make kvm-kernel, which make test does --
# ("no prepared guest kernel ...: run `make kvm-kernel`", in boot.sh and guest.rs.)
while IFS=: read -r file line msg; do
  [[ $msg == *'make kvm-kernel'* ]] ||
    problem "$file:$line says there is no prepared guest kernel without naming \`make kvm-kernel\`"
done < <(git grep -nE 'no prepared guest kernel' -- 'crates/*.rs' 'scripts/*.sh' ':!scripts/check-tools.sh')
if git grep -qF 'make kvm-kernel' -- 'crates/*.rs' 'scripts/*.sh' ':!scripts/check-tools.sh'; then
  kvm_n=$(HOME=$fresh_home mk -n -B kvm-kernel 2>/dev/null || true)
  grep -qF 'scripts/kvm/boot.sh --prepare' <<<"$kvm_n" ||
    problem "messages name make kvm-kernel, which does not run scripts/kvm/boot.sh --prepare"
  ! grep -vxF -f <(echo "$MAKE_N") <<<"$kvm_n" | grep -q . ||
    problem "messages name make kvm-kernel, which make test does not do: make it a prerequisite of test"
fi

# --- Commands make test needs and cannot install are here --------------------------------
for c in $(mkvar HOST_CMDS); do
  # scripts/k8s/build.sh also finds Go in /usr/local/go/bin.
  PATH="$PATH:/usr/local/go/bin" command -v "$c" >/dev/null ||
    problem "$c is not installed: make test needs it and cannot install it (HOST_CMDS);" \
      "make doctor says how to get it"
done

if [ "$problems" -gt 0 ]; then
  echo "check-tools: $problems problem(s); docs/testing.md says how to give a test its tool" >&2
  exit 1
fi
echo "check-tools: each of the $(wc -l <<<"$LOOKUPS") tool look-ups of the tests has a provider" \
  "($(printf '%s\n' "${!used[@]}" | sort | tr '\n' ' ' | sed 's/ $//'))"
