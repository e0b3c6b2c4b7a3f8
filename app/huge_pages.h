// Transparent huge pages for the heap. Distributions usually set THP to "madvise", and glibc's
// malloc asks for huge pages only when started with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (read
// once, at start-up). Without them every fresh activation buffer is faulted in 4 KiB at a time,
// which costs a VM exit per page on a cloud machine: SD2.1-base 512x512 bf16 on a 2-core EPYC VM,
// the first VAE decode in a process took 5.5-6.0 s without and 4.0-4.2 s with huge pages, the
// cold model load 8.5-13.5 s against 4.4-5.3 s, peak RSS 3380 against 3012 MiB (README).
#pragma once

namespace diffuse::app {

// Restarts this program (same arguments) once with glibc.malloc.hugetlb=1 added to
// GLIBC_TUNABLES, unless DIFFUSE_HUGE_PAGES=0, the tunables already name hugetlb, THP is
// "never" or the glibc predates the tunable (2.35). Returns only when it did not restart.
void restart_with_huge_pages(char** argv);

}  // namespace diffuse::app
