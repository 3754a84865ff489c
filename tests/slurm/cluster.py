"""A real SLURM cluster on this machine, for tests: munged, slurmctld and two emulated compute nodes.

    with Cluster(tmp_path) as cluster:        # installs slurm-wlm and munge first when they are missing
        subprocess.run(["sbatch", ...], env=cluster.env)

Each compute node is a `slurmd -D` in a network namespace of its own (its own hostname and /etc/hosts,
through `unshare --uts --mount`), joined to the controller by a veth pair on a bridge; traffic stays on
that bridge. No systemd and no cgroups are needed (proctrack/linuxproc, task/none), and there is no
accounting (slurmdbd), as on many small clusters. Each node declares `gpus_per_node` fake GPUs
(GresTypes=gpu, one empty file per device) so that GPU jobs are accepted and get CUDA_VISIBLE_DEVICES.

Everything is private to one instance (a random subnet, free ports, names with the pid, files under
`root`), so that test runs of several checkouts on one machine do not meet. `stop()` (also on any error
in `start()`) ends every process it started by PID, and every process left in the nodes' namespaces
(job steps outlive slurmd), then deletes the namespaces, the veths and the bridge.

As a script (measurements, debugging): `python tests/slurm/cluster.py ROOT` starts a cluster, prints the
environment to use it (`SLURM_CONF=...`) and stops it on Ctrl-C.
"""

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = {
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sbatch": "slurm-wlm",
    "munged": "munge",
    "ip": "iproute2",
    "unshare": "util-linux",
}


class ClusterUnavailable(RuntimeError):
    """The cluster could not be started here (one line saying why and what to do)."""


def run(command, timeout=60, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def last_line(result):
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit status {result.returncode}"


def ensure_packages():
    """Install slurm-wlm, munge (and iproute2) from Debian when a command is missing."""
    missing = sorted({package for command, package in PACKAGES.items() if shutil.which(command) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ClusterUnavailable(
            f"{', '.join(missing)} not installed and cannot install them here (needs root "
            f"and apt-get): apt-get install {' '.join(missing)}"
        )
    update = run(["apt-get", "update", "-q"], timeout=600)
    if update.returncode != 0:
        raise ClusterUnavailable(
            f"apt-get update failed, so {', '.join(missing)} cannot be installed: {last_line(update)}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], timeout=900, env=env)
    if install.returncode != 0:
        raise ClusterUnavailable(f"apt-get install {' '.join(missing)} failed: {last_line(install)}")


def free_port():
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def free_subnet():
    """A /24 in 10.0.0.0/8 that no interface of this machine is in."""
    used = run(["ip", "-o", "-4", "addr", "show"]).stdout
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
        if f" {net.network_address}"[:-1] not in used:
            return net
    raise ClusterUnavailable("no free 10.x.y.0/24 subnet for the test cluster's bridge")


class Cluster:
    # Declared, not real (config_overrides): room for a CPU training beside two of the profile's 2-GPU job
    # shapes (8 CPUs and 16 GB per GPU) on one node.
    def __init__(self, root, nodes=2, cpus=40, mem_mb=80000, gpus_per_node=4, partition="kws"):
        self.root = Path(root).resolve()
        self.node_names = [f"kwsn{i + 1}" for i in range(nodes)]
        self.cpus, self.mem_mb, self.gpus, self.partition = cpus, mem_mb, gpus_per_node, partition
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"kwsbr{tag}"
        self.netns = {name: f"kws{tag}{name}" for name in self.node_names}
        self.veth = {name: f"kv{tag}n{i + 1}" for i, name in enumerate(self.node_names)}
        self.processes = []  # (name, Popen, output file), in start order
        self.made = []  # ("netns"|"link", name) to delete at stop
        self.conf_dir = self.root / "etc"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf_dir / "slurm.conf"))

    # ------------------------------------------------------------------------------------ start
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=60):
        if sys.platform != "linux" or os.geteuid() != 0:
            raise ClusterUnavailable("the test cluster needs Linux and root (network namespaces, daemons)")
        ensure_packages()
        try:
            self._write_files()
            self._start_munge()
            self._network()
            self._start_controller()
            for name in self.node_names:
                self._start_node(name)
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _write_files(self):
        net = free_subnet()
        hosts = list(net.hosts())
        self.ctl_addr = str(hosts[0])
        self.node_addr = {name: str(hosts[i + 1]) for i, name in enumerate(self.node_names)}
        self.prefix = net.prefixlen
        for sub in ("etc", "munge", "ctld", "fakegpu", *(f"{name}/spool" for name in self.node_names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):  # character devices like /dev/null's, as slurmd wants for gres files
            with contextlib.suppress(FileExistsError):
                os.mknod(self.root / "fakegpu" / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        self.ctl_port, self.node_port = free_port(), free_port()
        r = self.root
        nodes = ",".join(self.node_names)
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        node_lines = "".join(
            f"NodeName={name} NodeAddr={self.node_addr[name]} CPUs={self.cpus} "
            f"RealMemory={self.mem_mb}{gres} State=UNKNOWN\n"
            for name in self.node_names
        )
        (self.conf_dir / "slurm.conf").write_text(f"""\
ClusterName=kwstest
SlurmctldHost={socket.gethostname().split(".")[0]}({self.ctl_addr})
SlurmctldPort={self.ctl_port}
SlurmdPort={self.node_port}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/ctld
SlurmctldPidFile={r}/ctld/slurmctld.pid
SlurmctldLogFile={r}/ctld/slurmctld.log
SlurmdSpoolDir={r}/%n/spool
SlurmdPidFile={r}/%n/slurmd.pid
SlurmdLogFile={r}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
# Finished jobs stay visible to squeue this long: the executor plugin's squeue status needs >= 30 s.
MinJobAge=300
KillWait=5
{node_lines}PartitionName={self.partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
""")
        if self.gpus:
            (self.conf_dir / "gres.conf").write_text(
                f"NodeName={nodes} Name=gpu File={r}/fakegpu/gpu[0-{self.gpus - 1}]\n"
            )
        (self.conf_dir / "hosts").write_text(
            "127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in self.node_addr.items())
        )

    def _spawn(self, name, command, log):
        handle = open(self.root / log, "ab")
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        handle.close()
        self.processes.append((name, process, self.root / log))
        return process

    def _start_munge(self):
        # As root (--force), like every daemon and job here: no folder of ours needs to be the munge user's.
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={munge}/munge.socket",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={munge}/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
            "munge/munged.out",
        )
        self._wait_for(lambda: (munge / "munge.socket").exists(), 10, "munged did not start", munge / "munged.out")

    def _ip(self, *args, netns=None):
        command = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
        result = run(command)
        if result.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(command)}: {last_line(result)}")

    def _network(self):
        self._ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(("link", self.bridge))
        self._ip("addr", "add", f"{self.ctl_addr}/{self.prefix}", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for name in self.node_names:
            ns, veth = self.netns[name], self.veth[name]
            self._ip("netns", "add", ns)
            self.made.append(("netns", ns))
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.made.append(("link", veth))
            self._ip("link", "set", veth, "master", self.bridge, "up")
            self._ip("addr", "add", f"{self.node_addr[name]}/{self.prefix}", "dev", "eth0", netns=ns)
            self._ip("link", "set", "eth0", "up", netns=ns)
            self._ip("link", "set", "lo", "up", netns=ns)

    def _start_controller(self):
        self._spawn(
            "slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf_dir / "slurm.conf")], "ctld/slurmctld.out"
        )
        self._wait_for(
            lambda: run(["scontrol", "ping"], env=self.env).stdout.count("UP") > 0,
            20,
            "slurmctld did not answer",
            self.root / "ctld" / "slurmctld.out",
        )

    def _start_node(self, name):
        # In the node's own mount namespace: its hostname's /etc/hosts, and our slurm.conf as
        # /etc/slurm, since the executor plugin's job steps drop SLURM_CONF from the environment.
        script = (
            f"hostname {name} && mount --bind {self.conf_dir / 'hosts'} /etc/hosts && "
            f"mount --bind {self.conf_dir} /etc/slurm && exec slurmd -D -N {name}"
        )
        # nsenter, not `ip netns exec`: that mounts a sysfs of its own, without the cgroup tree slurmd reads.
        self._spawn(
            name,
            [
                "nsenter",
                f"--net=/run/netns/{self.netns[name]}",
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            f"{name}/slurmd.out",
        )

    def _wait_idle(self, timeout):
        def idle():
            out = run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return all(states.get(name) == "idle" for name in self.node_names)

        self._wait_for(idle, timeout, "the compute nodes did not come up", self.root / "ctld" / "slurmctld.log")

    def _wait_for(self, ready, timeout, what, log):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [(name, out) for name, p, out in self.processes if p.poll() is not None]
            if dead:
                raise ClusterUnavailable(f"{dead[0][0]} exited: {self._tail(dead[0][1])}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterUnavailable(f"{what} within {timeout} s: {self._tail(log)}")

    @staticmethod
    def _tail(log):
        try:
            lines = Path(log).read_text(errors="replace").strip().splitlines()
        except OSError:
            return f"(no {log})"
        return lines[-1] if lines else f"(empty {log})"

    # ------------------------------------------------------------------------------------- stop
    def stop(self):
        """End what start() started, by PID, newest first; delete namespaces and links. Never raises."""
        for ns in self.netns.values():
            # Job steps (slurmstepd and the job's processes) are not slurmd's children: find them by namespace.
            if ("netns", ns) in self.made:
                for pid in run(["ip", "netns", "pids", ns]).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
        for _, process, _ in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        self.processes = []
        for kind, name in reversed(self.made):
            run(["ip", "netns", "delete", name] if kind == "netns" else ["ip", "link", "delete", name])
        self.made = []


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill`/`timeout` stop it cleanly too
    with Cluster(sys.argv[1] if len(sys.argv) > 1 else "/tmp/kws-slurm") as cluster:
        print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}   # Ctrl-C stops the cluster", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
