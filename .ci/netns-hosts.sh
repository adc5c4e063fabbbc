# Hosts on one Linux machine for the .ci/rehearse-* scripts: each a network namespace with its own
# address on a bridge (NAT to the outside, for pip), PID namespace, /tmp, /dev/shm, /root and
# /etc/hosts, so Ray on one host cannot see another's processes or session folders. Needs root,
# iproute2, iptables and (for sshd=1) openssh-server.
#
# The caller sets: work (a scratch folder), subnet, bridge, hosts (names), addr (name -> address),
# extra_hosts (lines for every /etc/hosts), host_env (name -> VAR=value words), sshd (1 or 0),
# init_extra (commands each host's init runs first, e.g. mounts), log (the transcript).

# One line naming what is missing, before anything is set up.
require_tools() {
    local missing=()
    [ "$(id -u)" = 0 ] || missing+=("root")
    for t in "$@"; do command -v "$t" >/dev/null || missing+=("$t"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "error: this rehearsal needs ${missing[*]} (Debian: apt-get install iproute2 iptables openssh-server rsync curl)" >&2
        exit 2
    fi
}

say() { printf '\n=== %s\n' "$*" | tee -a "$log"; }

teardown() {
    for h in "${hosts[@]}"; do
        [ -f "$work/$h/sshd.pid" ] && kill "$(cat "$work/$h/sshd.pid")" 2>/dev/null || true
        ip netns pids "rs-$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "rs-$h" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
    iptables -t nat -D POSTROUTING -s "$subnet.0/24" ! -o "$bridge" -j MASQUERADE 2>/dev/null || true
}

# Runs a command on host $1 (inside its namespaces, as a login shell would see it), with the
# variables of host_env[$1] (a pod's environment) set.
on() {
    local h=$1
    shift
    # shellcheck disable=SC2086  # host_env holds VAR=value words
    ip netns exec "rs-$h" nsenter --target "$(cat "$work/$h/init.pid")" --pid --mount \
        env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        TERM=xterm LANG=C.UTF-8 ${host_env[$h]:-} bash -c "$*"
}

make_hosts() {
    ip link add "$bridge" type bridge
    ip addr add "$subnet.1/24" dev "$bridge"
    ip link set "$bridge" up
    sysctl -qw net.ipv4.ip_forward=1
    iptables -t nat -A POSTROUTING -s "$subnet.0/24" ! -o "$bridge" -j MASQUERADE
    ssh-keygen -q -t ed25519 -N '' -f "$work/id_ed25519" -C rayspec-rehearsal
    for h in "${hosts[@]}"; do
        local dir=$work/$h
        mkdir -p "$dir/root/.ssh" /run/sshd
        cp /etc/skel/.bashrc /etc/skel/.profile "$dir/root/"
        cp "$work/id_ed25519.pub" "$dir/root/.ssh/authorized_keys"
        # The laptop keeps the Python its .venv was made with (pyenv here); the nodes start bare.
        if [ "$h" = laptop ] && [ -d /root/.pyenv ]; then mkdir -p "$dir/root/.pyenv"; fi
        chmod 700 "$dir/root" "$dir/root/.ssh"
        ip netns add "rs-$h"
        ip link add "veth-$h" type veth peer name eth0 netns "rs-$h"
        ip link set "veth-$h" master "$bridge" up
        ip -n "rs-$h" addr add "${addr[$h]}/24" dev eth0
        ip -n "rs-$h" link set eth0 up
        ip -n "rs-$h" link set lo up
        ip -n "rs-$h" route add default via "$subnet.1"
        ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
        cat >"$dir/sshd_config" <<EOF
ListenAddress ${addr[$h]}
HostKey $dir/host_key
PidFile $dir/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
UsePAM no
AcceptEnv LANG
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
        cp /etc/hosts "$dir/hosts"
        printf '%s\n' "${extra_hosts[@]}" >>"$dir/hosts"
        local init="exec sleep infinity"
        [ "${sshd:-1}" = 1 ] && init="exec /usr/sbin/sshd -D -e -f '$dir/sshd_config'"
        # The host's init: private /tmp, /dev/shm, /root and /etc/hosts, then sshd (or a sleep).
        ip netns exec "rs-$h" unshare --pid --mount --fork --mount-proc bash -c "
            mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /dev/shm
            [ -d '$dir/root/.pyenv' ] && mount --bind /root/.pyenv '$dir/root/.pyenv'
            mount --rbind '$dir/root' /root
            mount --bind '$dir/hosts' /etc/hosts
            ${init_extra:-}
            $init" >"$dir/init.log" 2>&1 &
        # unshare --fork: the host's first process is its child (PID 1 inside, this one outside).
        local parent=$!
        for _ in $(seq 50); do pgrep -P "$parent" >"$dir/init.pid" && break; sleep 0.1; done
    done
    # The laptop has this checkout (with its .venv, as after the README's quickstart) and the key.
    mkdir -p "$work/laptop/root/.ssh"
    cp "$work/id_ed25519" "$work/laptop/root/.ssh/id_ed25519"
}

