#!/bin/sh
# Make sure the virtualenv the Makefile installs into exists and works.
#
#   sh devtools/venv.sh PYTHON VENV
#
# VENV is either the virtualenv already active in the caller's shell ($VIRTUAL_ENV: used
# as it is, never re-created) or the project's own .venv/, created with PYTHON when it is
# missing or broken (e.g. made by a Python that has since been removed). The Makefile
# never installs into PYTHON itself: on Debian/Ubuntu that interpreter is marked
# externally managed (PEP 668) and pip refuses, and elsewhere it would mix amqpd's
# dependencies into a Python that other programs use.
#
# Debian and Ubuntu ship `venv` without `ensurepip` unless python3-venv is installed;
# as root with apt-get this script installs it (as `make test` does for RabbitMQ),
# otherwise it says what to install and stops.
set -eu

python=$1
venv=$2

die() {
    printf 'make: %s\n' "$@" >&2
    exit 1
}

min_version='import sys; sys.exit(sys.version_info < (3, 11))'

if [ -n "${VIRTUAL_ENV:-}" ] && [ "$venv" -ef "$VIRTUAL_ENV" ]; then
    [ -x "$venv/bin/python" ] || die "the active virtualenv $venv has no bin/python"
    "$venv/bin/python" -c "$min_version" \
        || die "the active virtualenv $venv runs Python $("$venv/bin/python" -V 2>&1);" \
               "amqpd needs 3.11 or later: deactivate it or make another one"
    "$venv/bin/python" -m pip --version >/dev/null 2>&1 \
        || die "the active virtualenv $venv has no pip: $venv/bin/python -m ensurepip"
    exit 0
fi

if "$venv/bin/python" -c "$min_version" 2>/dev/null \
        && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    exit 0  # already there and working
fi
if [ -e "$venv" ]; then
    [ -f "$venv/pyvenv.cfg" ] || die "$venv exists but is not a virtualenv; move it away"
    echo "$venv does not work any more (its Python is gone or too old): making it anew"
    rm -rf "$venv"
fi

command -v "$python" >/dev/null 2>&1 \
    || die "no $python here: install Python 3.11 or later (Debian/Ubuntu: apt-get" \
           "install python3 python3-venv) or name one with PYTHON=/path/to/python3.11"
"$python" -c "$min_version" \
    || die "$python is Python $("$python" -V 2>&1 | cut -d' ' -f2); amqpd needs 3.11 or" \
           "later: name another one with PYTHON=/path/to/python3.11"

# `venv` may be there without `ensurepip` (Debian's split): then `-m venv` fails half-way.
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    package="python$version-venv"
    if [ "$(command -v "$python")" -ef /usr/bin/python3 ]; then
        package=python3-venv  # the distribution's own python3: its meta-package
    fi
    from_distribution=no  # installed by the system's package manager (prefix /usr)
    if "$python" -c 'import sys; sys.exit(sys.base_prefix != "/usr")'; then
        from_distribution=yes
    fi
    if [ "$from_distribution" = yes ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "$python cannot make virtualenvs (no ensurepip): installing $package"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package") \
            >/dev/null 2>&1 || die "could not install $package with apt-get"
        "$python" -c 'import venv, ensurepip' 2>/dev/null \
            || die "$package is installed but $python still has no ensurepip"
    elif [ "$from_distribution" = yes ]; then
        die "$python cannot make a virtualenv: its venv module is not installed." \
            "Install it with:  sudo apt-get install $package" \
            "(or run make inside an active virtualenv, or set PYTHON= to another Python 3.11+)"
    else
        die "$python cannot make a virtualenv: it has no ensurepip module." \
            "Use a Python built with it (pyenv, conda and python.org builds have it)," \
            "run make inside an active virtualenv, or set PYTHON= to another Python 3.11+"
    fi
fi

echo "making the virtualenv $venv with $python ($("$python" -V 2>&1))"
if ! "$python" -m venv "$venv"; then
    rm -rf "$venv"
    die "$python -m venv $venv failed (see above)"
fi
