"""This process's peak resident memory in MiB, as the C++ side measures it.

VmHWM from /proc/self/status, not getrusage's ru_maxrss: Linux carries the
spawning process's peak across fork + exec, so the benchmark script that
starts a run would leak its own peak into the run's figure.
"""
import resource


def peak_rss_mib():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
