# SPDX-License-Identifier: MIT
flx_unit(test_view flx_fs)
# Generated files (index.json, safetensors headers, .npy) against jansson.
flx_unit(test_formats flx_fs flx_test_synth)
# The hand matcher of the default layer regex against regexec().
flx_unit(test_spec flx_reshard)
# The block cache of strided gathers: replacement, pins, errors, threads.
flx_unit(test_bcache flx_resolver)
# The CPU slicer (the tiled transpose too) against a naive oracle.
flx_unit(test_slice flx_reshard)
# The transform stage and its casts against formula and vector oracles.
flx_unit(test_transform flx_fs)
# Placement decisions: undecided tensors, FSDP-aware split inference.
flx_unit(test_plan flx_reshard)
# The paddle/ tree (.pdparams, .pdopt) loaded by pickle.load.
flx_unit(test_pdparams flx_fs flx_test_synth)
# MindSpore .ckpt files: varints, cuts, whole files through a wire decoder.
flx_unit(test_msckpt flx_fs)
# The CUDA backend's table of kept blocks (gpu/slice_slots.h), on the host.
flx_unit(test_slots flx_gpu)
# The passthrough decision: which files are the whole of one backing file.
flx_unit(test_whole flx_fs)
