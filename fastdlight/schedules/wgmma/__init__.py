"""The Hopper (``sm_90a``) matmul template: TMA loads into a multi-stage mbarrier ring, wgmma with
fp32 accumulation, producer and consumer warpgroups, the epilogue fused (:mod:`.template`, with
the kernel's numbers in :mod:`.plan`, the epilogue in :mod:`.epilogue`, the TMA tensor maps in
:mod:`.tma` and the TIRx kernel text in ``kernel.tvmscript``)."""
