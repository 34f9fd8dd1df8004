"""A TopK sparse autoencoder (Gao et al., 2024, "Scaling and evaluating sparse autoencoders"): one hook point's
activation x, d_in numbers, written as a sparse sum of d_sae learned directions, the features,

    f = TopK(ReLU((x - b_dec) W_enc + b_enc))    (the k largest kept, the others 0)
    x̂ = f W_dec + b_dec

and its training: the decoder's rows kept at unit norm, the encoder started as the decoder's transpose, the
auxiliary loss that brings dead features back (AuxK), all on activations scaled to a mean norm of √d_in, a scale
folded into the weights once trained so that the saved SAE reads raw activations. The same equations as SAELens's
TopKSAE (architecture 'topk', apply_b_dec_to_input): the file it saves is SAELens's (gptkit/interp/features.py)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptkit.base.errors import UserError

AUX_K_SHARE = 0.5  # the auxiliary loss reconstructs the error from the d_in/2 largest dead features (Gao et al.)
AUX_SCALE = 1 / 32  # its weight in the loss (Gao et al.'s alpha)


class SparseAutoencoder(nn.Module):
    """W_enc (d_in, d_sae), b_enc (d_sae), W_dec (d_sae, d_in), b_dec (d_in), k: SAELens's names and shapes."""

    def __init__(self, d_in, d_sae, k, generator=None):
        super().__init__()
        self.k = k
        directions = F.normalize(torch.randn(d_sae, d_in, generator=generator), dim=-1)
        self.W_dec = nn.Parameter(directions)
        self.W_enc = nn.Parameter(directions.T.clone())  # tied at the start: no feature begins dead (Gao et al.)
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.zeros(d_in))

    @property
    def d_in(self):
        return self.W_dec.size(1)

    @property
    def d_sae(self):
        return self.W_dec.size(0)

    def pre_activations(self, x):
        return (of_width(x, self.d_in, "activations it encodes") - self.b_dec) @ self.W_enc + self.b_enc

    def encode_sparse(self, x):
        """(values, indices), (..., k) each: the k features kept for each activation, their values ≥ 0."""
        values, indices = self.pre_activations(x).topk(self.k, dim=-1, sorted=False)
        return values.relu(), indices

    def encode(self, x):
        """Every feature's activation, (..., d_sae): 0 except the k kept."""
        values, indices = self.encode_sparse(x)
        return torch.zeros(*x.shape[:-1], self.d_sae, dtype=values.dtype, device=x.device).scatter(-1, indices,
                                                                                                    values)

    def decode_sparse(self, values, indices):
        """f W_dec + b_dec from the k kept features: scattered into a row of d_sae and multiplied, which on a CPU
        beats gathering k rows (whose backward sorts the indices) at these sizes."""
        f = torch.zeros(*values.shape[:-1], self.d_sae, dtype=values.dtype, device=values.device)
        return self.decode(f.scatter(-1, indices, values))

    def decode(self, f):
        return of_width(f, self.d_sae, "feature values it decodes") @ self.W_dec + self.b_dec

    def forward(self, x):
        return self.decode_sparse(*self.encode_sparse(x))

    @torch.no_grad()
    def fold_scale(self, scale):
        """Trained on activations multiplied by scale, made to read and write raw ones: the same features
        (pre-activations unchanged, so the same k kept) and x̂ divided by scale."""
        self.W_enc.mul_(scale)
        self.W_dec.div_(scale)
        self.b_dec.div_(scale)


def of_width(x, width, what):
    """x, when its last dimension is width; one line naming the shape expected otherwise (a 0-dimensional tensor
    would broadcast into a result of no meaning)."""
    if x.dim() == 0 or x.size(-1) != width:
        raise UserError(f"the SAE reads {what} as a tensor of shape (..., {width}), {width} numbers a token; "
                        f"got one of shape {tuple(x.shape)}")
    return x


class Trainer:
    """Adam on the reconstruction's squared error plus AuxK, the decoder's rows renormalised after each step and
    their gradient's component along themselves removed before it; the learning rate decays linearly to 0 over
    the last fifth of the steps. Tracks how long each feature has gone without firing (the dead ones)."""

    def __init__(self, sae, lr, steps, dead_after):
        self.sae, self.steps, self.dead_after, self.step = sae, steps, dead_after, 0
        self.opt = torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999), eps=6.25e-10)
        self.lr = lr
        self.since_fired = torch.zeros(sae.d_sae, dtype=torch.long)  # activations seen since each last fired

    def lr_at(self, step):
        decay_from = int(self.steps * 0.8)
        return self.lr * min(1.0, max(0.0, (self.steps - step) / max(1, self.steps - decay_from)))

    def train_step(self, x):
        """One step on a batch (B, d_in) of scaled activations: (the reconstruction's squared error summed over
        d_in and averaged over B, the fraction of variance it leaves unexplained)."""
        sae = self.sae
        values, indices = sae.encode_sparse(x)
        recon = sae.decode_sparse(values, indices)
        error = (recon - x).pow(2).sum(-1)
        loss = error.mean()
        dead = self.since_fired >= self.dead_after
        aux = self.aux_loss(x, recon, dead) if dead.any() else None
        if aux is not None:
            loss = loss + AUX_SCALE * aux
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(self.step)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.keep_decoder_norm_gradient()
        self.opt.step()
        with torch.no_grad():
            sae.W_dec.copy_(F.normalize(sae.W_dec, dim=-1))
            fired = torch.zeros(sae.d_sae, dtype=torch.bool).index_fill_(0, indices[values > 0], True)
            self.since_fired += x.size(0)
            self.since_fired[fired] = 0
        self.step += 1
        unexplained = error.sum() / (x - x.mean(0)).pow(2).sum()
        return error.mean().item(), unexplained.item()

    def aux_loss(self, x, recon, dead):
        """AuxK: the error x - x̂ reconstructed from the largest dead features alone (their decoder rows, no
        bias), scored against the error's own size, so that it never outweighs the main loss."""
        sae = self.sae
        residual = (x - recon).detach()
        pre = sae.pre_activations(x).masked_fill(~dead, float("-inf"))
        k_aux = min(int(dead.sum()), max(1, int(sae.d_in * AUX_K_SHARE)))
        values, indices = pre.topk(k_aux, dim=-1, sorted=False)
        guess = sae.decode_sparse(values.relu(), indices) - sae.b_dec  # their rows alone
        return (guess - residual).pow(2).sum(-1).mean() / residual.pow(2).sum(-1).mean().clamp_min(1e-12)

    @torch.no_grad()  # W requires grad: outside no_grad the subtraction would chain a graph onto the gradient
    def keep_decoder_norm_gradient(self):
        """The decoder's rows are renormalised after the step: the gradient along a row would only change its
        length, so it is removed, leaving Adam's moments to the directions."""
        W, grad = self.sae.W_dec, self.sae.W_dec.grad
        if grad is not None:
            grad -= (grad * W).sum(-1, keepdim=True) * W

    def dead_fraction(self):
        return (self.since_fired >= self.dead_after).float().mean().item()

    def state_dict(self):
        return {"opt": self.opt.state_dict(), "step": self.step, "since_fired": self.since_fired}

    def load_state_dict(self, state):
        self.opt.load_state_dict(state["opt"])
        self.step, self.since_fired = state["step"], state["since_fired"]


def activation_scale(x):
    """The factor that brings a sample of activations (N, d_in) to a mean norm of √d_in, so that one learning
    rate fits every site and model width."""
    return math.sqrt(x.size(-1)) / x.norm(dim=-1).mean().clamp_min(1e-12).item()
