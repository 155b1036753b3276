#!/usr/bin/env python3
"""Write the hwloc XML topologies used by the NUMA tests and `--topology` examples.

A 1-node build machine cannot show the layouts that matter on EPYC, so the tests load these
files instead: Genoa-style interleaved CPU numbering, asymmetric nodes, a memoryless node and
a CPU-less (CXL-style) memory node. Run from this folder: `python3 make_xml.py`.
"""

GIB = 1 << 30


def mask(ids):
    """hwloc bitmap string: 32-bit words, most significant first, comma separated."""
    if not ids:
        return "0x0"
    words = [0] * (max(ids) // 32 + 1)
    for i in ids:
        words[i // 32] |= 1 << (i % 32)
    return ",".join("0x%08x" % w for w in reversed(words))


def sets(cpus, nodes):
    c, n = mask(cpus), mask(nodes)
    return 'cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"' % (c, c, n, n)


class Writer:
    def __init__(self):
        self.lines = []
        self.gp = 1

    def gp_index(self):
        self.gp += 1
        return self.gp

    def add(self, depth, text):
        self.lines.append("  " * depth + text)


def package(w, pkg_index, nodes, depth):
    """nodes: list of (node_os, mem_bytes, cores) where cores is a list of PU-id lists."""
    all_cpus = sorted(p for _, _, cores in nodes for core in cores for p in core)
    all_nodes = [n for n, _, _ in nodes]
    w.add(depth, '<object type="Package" os_index="%d" %s gp_index="%d">'
          % (pkg_index, sets(all_cpus, all_nodes), w.gp_index()))
    for node_os, mem, cores in nodes:
        cpus = sorted(p for core in cores for p in core)
        # Several nodes per package sit in a Group, as hwloc reports NPS2/NPS4 parts.
        inner = depth + 1
        if len(nodes) > 1:
            w.add(inner, '<object type="Group" %s gp_index="%d" kind="1001" subkind="0">'
                  % (sets(cpus, [node_os]), w.gp_index()))
            inner += 1
        w.add(inner, '<object type="NUMANode" os_index="%d" %s gp_index="%d" local_memory="%d"/>'
              % (node_os, sets(cpus, [node_os]), w.gp_index(), mem))
        for core_pus in cores:
            w.add(inner, '<object type="Core" os_index="%d" %s gp_index="%d">'
                  % (core_pus[0], sets(core_pus, [node_os]), w.gp_index()))
            for pu in core_pus:
                w.add(inner + 1, '<object type="PU" os_index="%d" %s gp_index="%d"/>'
                      % (pu, sets([pu], [node_os]), w.gp_index()))
            w.add(inner, "</object>")
        if len(nodes) > 1:
            w.add(depth + 1, "</object>")
    w.add(depth, "</object>")


def topology(path, packages, distances=None, extra_nodes=()):
    """packages: list of node lists (see package()); extra_nodes: CPU-less (node_os, mem)."""
    w = Writer()
    all_cpus = sorted(p for nodes in packages for _, _, cores in nodes for core in cores for p in core)
    all_nodes = sorted([n for nodes in packages for n, _, _ in nodes] + [n for n, _ in extra_nodes])
    w.add(0, '<?xml version="1.0" encoding="UTF-8"?>')
    w.add(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    w.add(0, '<topology version="2.0">')
    w.add(1, '<object type="Machine" os_index="0" %s allowed_cpuset="%s" allowed_nodeset="%s" gp_index="1">'
          % (sets(all_cpus, all_nodes), mask(all_cpus), mask(all_nodes)))
    for node_os, mem in extra_nodes:
        # A CPU-less memory node hangs off the machine with an empty cpuset.
        w.add(2, '<object type="NUMANode" os_index="%d" %s gp_index="%d" local_memory="%d"/>'
              % (node_os, sets([], [node_os]), w.gp_index(), mem))
    for i, nodes in enumerate(packages):
        package(w, i, nodes, 2)
    w.add(1, "</object>")
    if distances:
        n = len(all_nodes)
        w.add(1, '<distances2 type="NUMANode" nbobjs="%d" kind="5" name="NUMALatency" indexing="os">' % n)
        # hwloc's "length" is the text length, trailing space included.
        idx = "".join("%d " % x for x in all_nodes)
        flat = "".join("%d " % v for row in distances for v in row)
        w.add(2, '<indexes length="%d">%s</indexes>' % (len(idx), idx))
        w.add(2, '<u64values length="%d">%s</u64values>' % (len(flat), flat))
        w.add(1, "</distances2>")
    w.add(0, "</topology>")
    with open(path, "w") as f:
        f.write("\n".join(w.lines) + "\n")


def cores(first_pus, smt_offset=None):
    """One core per first PU id; its sibling is first + smt_offset (Linux numbers SMT siblings
    after all first threads, so on Genoa node 0 holds 0-31 and 64-95)."""
    if smt_offset is None:
        return [[p] for p in first_pus]
    return [[p, p + smt_offset] for p in first_pus]


def main():
    # 2-socket Genoa, NPS1, 32 cores x 2 threads per socket: node 0 = 0-31,64-95; node 1 = 32-63,96-127.
    topology("genoa-2s-nps1-interleaved.xml",
             [[(0, 384 * GIB, cores(range(0, 32), 64))],
              [(1, 384 * GIB, cores(range(32, 64), 64))]],
             distances=[[10, 32], [32, 10]])
    # Asymmetric: one socket has twice the cores and four times the memory of the other.
    topology("asymmetric-2node.xml",
             [[(0, 256 * GIB, cores(range(0, 16)))],
              [(1, 64 * GIB, cores(range(16, 24)))]],
             distances=[[10, 21], [21, 10]])
    # Memoryless node: node 1 has cores but no local memory (its DIMMs are missing).
    topology("memoryless-node.xml",
             [[(0, 128 * GIB, cores(range(0, 8))), (1, 0, cores(range(8, 16)))],
              [(2, 128 * GIB, cores(range(16, 24)))]],
             distances=[[10, 12, 32], [12, 10, 32], [32, 32, 10]])
    # CPU-less memory node (CXL expander) next to a normal 2-node machine.
    topology("cxl-cpuless-node.xml",
             [[(0, 64 * GIB, cores(range(0, 8)))], [(1, 64 * GIB, cores(range(8, 16)))]],
             distances=[[10, 32, 50], [32, 10, 50], [50, 50, 10]],
             extra_nodes=[(2, 256 * GIB)])


if __name__ == "__main__":
    main()
