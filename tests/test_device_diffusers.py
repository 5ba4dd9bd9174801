"""Diffusers on the ``neuron`` device: pipelines, transformers and a compiled UNet against CPU eager.

Tiny models with random weights (no download). Each test runs the same model on CPU and on
``neuron`` and compares with ``torch.testing.assert_close`` at its default tolerances. The norm,
gelu, convolution and reduction tests are the fixes these models found in bfloat16 and float16:
layer and group norm ran as ATen's composite (a ``native_batch_norm`` in the input's dtype), gelu
step by step in the input's dtype, convolution added its bias after rounding, sums accumulated in
the input's dtype and x * 1.7 rounded 1.7 to bfloat16, where CPU computes in float32 and rounds once.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from neuron_compile.device import ops as device_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def N(t):
    return t.to("neuron")


def _diffusers():
    return pytest.importorskip("diffusers", reason="diffusers is a test extra")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_layer_and_group_norm_compute_in_float32_like_cpu(dtype):
    torch.manual_seed(0)
    x, w, b = (torch.randn(2, 8, 4, 4) * 3).to(dtype), torch.randn(8).to(dtype), torch.randn(8).to(dtype)
    cases = [lambda x, w, b: F.layer_norm(x.transpose(1, 3), (8,), w, b),
             lambda x, w, b: F.layer_norm(x, (4, 4)),
             lambda x, w, b: F.group_norm(x, 4, w, b),
             lambda x, w, b: F.group_norm(x, 2)]
    for fn in cases:
        ref_in = [t.clone().requires_grad_() for t in (x, w, b)]
        dev_in = [N(t).requires_grad_() for t in (x, w, b)]
        want, got = fn(*ref_in), fn(*dev_in)
        assert_close(got.cpu(), want)  # bfloat16: half of a layer norm's outputs were an ulp off
        if dtype == torch.float32:  # CPU's half-precision weight gradients round partial sums itself
            grad = torch.randn_like(want)
            want.backward(grad)
            got.backward(N(grad))
            for d, r in zip(dev_in, ref_in):
                if r.grad is not None:
                    assert_close(d.grad.cpu(), r.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_half_precision_gelu_computes_in_float32_like_cpu(dtype, approximate):
    # torch-mlir lowered gelu step by step in bfloat16: 40% of the outputs were an ulp or more off
    torch.manual_seed(0)
    x, grad = (torch.randn(8, 16) * 3).to(dtype), torch.randn(8, 16).to(dtype)
    ref = x.clone().requires_grad_()
    want = F.gelu(ref, approximate=approximate)
    want.backward(grad)
    for run in ("device", "compiled"):
        inp = (N(x) if run == "device" else x.clone()).requires_grad_()
        fn = F.gelu if run == "device" else torch.compile(F.gelu, backend="neuron")
        got = fn(inp, approximate=approximate)
        got.backward(grad.to(inp.device))
        assert_close(got.cpu(), want.detach())
        assert_close(inp.grad.cpu(), ref.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_convolution_computes_in_float32_like_cpu(dtype):
    # the bias was added after rounding to bfloat16: a quarter of a 3x3 convolution's outputs were off
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 16, 6, 6).to(dtype), torch.randn(8, 16, 3, 3).to(dtype), torch.randn(8).to(dtype)
    cases = [lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda x, w, b: F.conv2d(x, w, None, stride=2)]
    for fn in cases:
        want = fn(x, w, b)
        assert_close(fn(N(x), N(w), N(b)).cpu(), want)
        assert_close(torch.compile(fn, backend="neuron")(x, w, b), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sums_and_means_accumulate_in_float32_like_cpu(dtype):
    # XLA reduced in bfloat16: half of the row sums were off
    torch.manual_seed(0)
    x = (torch.randn(16, 64) * 3).to(dtype)
    cases = [lambda x: x.sum(-1), lambda x: x.sum(), lambda x: x.mean(-1), lambda x: x.mean((0, 1), keepdim=True),
             lambda x: x.sum(-1, dtype=torch.float32), lambda x: x.mean(-1, dtype=torch.float32)]
    for fn in cases:
        want = fn(x)
        for got in (fn(N(x)).cpu(), torch.compile(fn, backend="neuron")(x)):
            assert got.dtype == want.dtype
            assert_close(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_times_a_number_computes_in_float32_like_cpu(dtype):
    # the number was rounded to bfloat16 first (1.7 -> 1.703125): a third of x * 1.7 was off; ATen's
    # add and sub do round the number, and 0-d tensor * x rounds it: those must stay as they are
    torch.manual_seed(0)
    x = (torch.randn(64) * 3).to(dtype)
    cases = [lambda x: x * 1.7, lambda x: 1.7 * x, lambda x: x / 3.3, lambda x: x.clone().mul_(1.7),
             lambda x: x.clone().div_(3.3), lambda x: torch.mul(x, 1.7, out=torch.empty_like(x)),
             lambda x: x * torch.tensor(1.7, device=x.device), lambda x: torch.tensor(1.7, device=x.device) * x,
             lambda x: x + 0.3, lambda x: x - 0.3, lambda x: x[0] * 1.7]
    for fn in cases:
        want = fn(x)
        for got in (fn(N(x)).cpu(), torch.compile(fn, backend="neuron")(x)):
            assert got.dtype == want.dtype
            assert_close(got, want)
    xn = N(x)
    assert_close((xn * 1.1).cpu(), x * 1.1)
    compiles = device_ops.COUNTS["op_compiles"]
    for v in (1.3, 1.7, 2.9):  # a new number is a new 0-d input, not a new executable
        assert_close((xn * v).cpu(), x * v)
    assert device_ops.COUNTS["op_compiles"] == compiles


def _tiny_unet(diffusers):
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4, attention_head_dim=8).eval()


@pytest.mark.slow
def test_ddpm_and_ddim_pipelines_give_cpu_images():
    diffusers = _diffusers()
    torch.manual_seed(0)
    unet = _tiny_unet(diffusers)
    ddpm = diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(num_train_timesteps=10))
    ddim = diffusers.DDIMPipeline(unet=unet, scheduler=diffusers.DDIMScheduler(num_train_timesteps=10))
    for pipe in (ddpm, ddim):
        pipe.set_progress_bar_config(disable=True)

    def run():
        # a CPU generator: randn_tensor draws on it and moves the noise to the pipeline's device
        images = ddpm(batch_size=1, num_inference_steps=2, output_type="np",
                      generator=torch.Generator().manual_seed(0)).images
        # no generator: the device's own draws (CPU's default generator) give CPU's noise, eta's too
        torch.manual_seed(5)
        latents = ddim(batch_size=1, num_inference_steps=3, eta=1.0, output_type="pt").images
        return images, latents

    want_images, want_latents = run()
    ddpm.to("neuron")
    assert ddim.device.type == "neuron"  # the two pipelines share the UNet
    images, latents = run()
    assert latents.device.type == "neuron"
    assert_close(images, want_images)
    assert_close(latents.cpu(), want_latents)


@pytest.mark.slow
def test_flux_transformer_forward_gives_cpu_numbers():
    diffusers = _diffusers()
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=False,
        axes_dims_rope=(2, 2, 4)).eval()
    inputs = dict(hidden_states=torch.randn(1, 16, 4), encoder_hidden_states=torch.randn(1, 4, 16),
                  pooled_projections=torch.randn(1, 8), timestep=torch.tensor([0.5]),
                  img_ids=torch.randn(16, 3), txt_ids=torch.zeros(4, 3))
    with torch.no_grad():
        want = model(**inputs).sample
        model.to("neuron")
        got = model(**{k: N(v) for k, v in inputs.items()}).sample
    assert got.device.type == "neuron"
    assert_close(got.cpu(), want)


@pytest.mark.slow
def test_compiled_conditional_unet_on_neuron_tensors_gives_cpu_numbers():
    diffusers = _diffusers()
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=4).eval()
    x, text = torch.randn(2, 4, 8, 8), torch.randn(2, 5, 16)
    steps = [torch.tensor([3, 7]), torch.tensor([4, 8])]
    with torch.no_grad():
        wants = [unet(x, t, text).sample for t in steps]
        unet.to("neuron")
        compiled = torch.compile(unet, backend="neuron")
        for t, want in zip(steps, wants):
            got = compiled(N(x), N(t), N(text)).sample
            assert got.device.type == "neuron"
            assert_close(got.cpu(), want)
