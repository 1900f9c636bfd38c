"""What each recipe key of timm's optimizers means: the ``Args:`` of the factories :mod:`.timm_optim` makes.

Declared once per name where the name means the same in every optimizer that takes it (:data:`SHARED`), and per
family of optimizers (the names timm gives one class) where a name means something of its own there (:data:`OWN`,
which wins).  ``weight_decay`` follows the switch an optimizer has for it (``decoupled_decay``, ``decoupled``,
``decoupled_weight_decay``: :func:`_switched_decay`), else it is decoupled, AdamW-style, unless :data:`OWN` says
otherwise.  A parameter a new timm adds and nothing here names has no meaning: tests/test_param_docs.py says which.
"""

from __future__ import annotations

from collections.abc import Iterable

WD_DECOUPLED = (
    "decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay, apart from the "
    "gradient update; 0 for none"
)
WD_L2 = "L2 penalty: weight_decay * weights is added to the gradient before the update; 0 for none"
DECOUPLED_SWITCH = (
    "decay the weights directly (multiply them by 1 - lr * weight_decay each step, AdamW-style) "
    "instead of adding weight_decay * weights to the gradient (L2)"
)
CAUTION = (
    "cautious update (arXiv 2411.16085): the update's components whose sign disagrees with the current "
    "gradient are zeroed and the rest scaled up by 1 / (kept fraction); the c-prefixed names turn it on"
)
MOMENTUM_SGD = (
    "momentum factor: the buffer becomes momentum * buffer + (1 - dampening) * gradient and the step "
    "follows it; 0 for plain SGD"
)
# the switch that decides whether an optimizer's weight decay is decoupled or an L2 term (timm's and torch's names)
SWITCHES = ("decoupled_decay", "decoupled", "decoupled_weight_decay")

SHARED: dict[str, str] = {
    "lr": "base learning rate: the schedule multiplies it at every step (it is the rate at multiplier 1.0)",
    "betas": (
        "(beta1, beta2): decay rates of the running averages of the gradient and of the squared gradient; "
        "closer to 1 averages over more steps (about 1 / (1 - beta))"
    ),
    "eps": "small constant added to the denominator (the root of the squared-gradient average) to keep it finite",
    "weight_decay": WD_DECOUPLED,
    "momentum": MOMENTUM_SGD,
    "nesterov": "Nesterov momentum: step along gradient + momentum * buffer instead of along the buffer alone",
    "dampening": (
        "share of each gradient left out of the momentum buffer (it adds (1 - dampening) * gradient); "
        "0 for none, as nesterov needs"
    ),
    "caution": CAUTION,
    "corrected_weight_decay": (
        "scale the decoupled weight decay by lr_t^2 / lr instead of lr_t (lr_t: the "
        "scheduled rate), so it fades with the square of the schedule (arXiv 2506.02285); "
        "no effect where the decay is not decoupled"
    ),
    "amsgrad": (
        "AMSGrad: divide by the running maximum of the squared-gradient average instead of its current "
        "value, so no parameter's step size grows back"
    ),
    **{switch: DECOUPLED_SWITCH for switch in SWITCHES},
    "grad_averaging": (
        "scale each gradient by (1 - beta1) when adding it to the first moment (a true average); false adds it whole"
    ),
    "always_adapt": (
        "apply the layer-wise trust ratio also to parameters with weight_decay 0 (the no-decay group of "
        "no_decay_norm_and_bias), which otherwise take a plain step"
    ),
    "clipping_threshold": (
        "StableAdamW clipping: each tensor's step is divided by max(1, RMS(gradient / "
        "denominator) / clipping_threshold), damping sudden gradient spikes (not the weight "
        "decay); 1.0 as in the paper, null for none"
    ),
    "centered": (
        "centered RMSprop: divide by the root of the gradient's variance estimate (squared average minus "
        "squared mean) instead of its raw squared average"
    ),
    "no_decay_norm_and_bias": (
        "put 1-D parameters (biases, norm scales) in a group with weight_decay 0, as most "
        "ImageNet recipes do; false decays every parameter"
    ),
}

# the names timm (torch) gives one optimizer class
FAMILIES: dict[str, tuple[str, ...]] = {
    "adabelief": ("adabelief", "radabelief"),
    "adadelta": ("adadelta",),
    "adafactor": ("adafactor", "cadafactor"),
    "adafactorbv": ("adafactorbv", "adafactorbvc", "cadafactorbv", "cadafactorbvc"),
    "adagrad": ("adagrad",),
    "adamax": ("adamax",),
    "adamp": ("adamp", "cadamp"),
    "adan": ("adan", "adanw", "cadan", "cadanw"),
    "adopt": ("adopt", "adoptc", "adoptw", "cadopt", "cadoptc", "cadoptw"),
    "lamb": ("lamb", "lambc", "lambcd", "lambcw", "lambw", "clamb", "clambw"),
    "laprop": ("laprop", "lapropc", "claprop"),
    "lars": ("lars", "larc", "nlars", "nlarc"),
    "lion": ("lion", "lionc", "clion", "clionc"),
    "madgrad": ("madgrad", "madgradw"),
    "mars": ("mars", "cmars"),
    "muon": ("muon", "nmuon", "adamuon", "nadamuon"),
    "nadam": ("nadam",),
    "nadamlegacy": ("nadamlegacy",),
    "novograd": ("novograd", "novogradc", "novogradw"),
    "rmsprop": ("rmsprop",),
    "rmsproptf": ("rmsproptf", "rmsproptfc", "rmsproptfw", "crmsproptf"),
    "sgdp": ("sgdp", "csgdp"),
}
FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}

_PROJECTION = {
    "delta": (
        "a weight's update is projected (its radial part removed) when the |cosine| of gradient and weight "
        "stays below delta / sqrt(size), per channel and then per layer: the test for scale-invariant weights"
    ),
    "wd_ratio": "factor on the weight decay of weights whose update was projected",
    "caution": (
        "cautious update: components whose sign disagrees with the gradient (for projected weights, with "
        "its tangential part: the spherical variant) are zeroed, the rest scaled up by 1 / (kept fraction)"
    ),
}
_ADAFACTOR_NULL_LR = "(only with lr null)"

OWN: dict[str, dict[str, str]] = {
    "adabelief": {
        "betas": (
            "(beta1, beta2): decay rates of the gradient's running average and of the running average of its "
            "squared deviation from that average (the 'belief')"
        ),
        "eps": "constant added to the squared-deviation average at every step and to its root in the denominator",
        "amsgrad": (
            "AMSGrad: divide by the running maximum of the squared-deviation average, so no parameter's "
            "step size grows back"
        ),
        "weight_decay": (
            "weight decay strength: with decoupled_decay the weights shrink by lr * weight_decay each "
            "step (by weight_decay with fixed_decay), else weight_decay * weights is added to the "
            "gradient (L2); 0 for none"
        ),
        "fixed_decay": "with decoupled_decay, shrink the weights by weight_decay per step whatever the lr",
        "rectify": (
            "RAdam's rectification: damp the adaptive steps while the variance estimate rests on few steps; "
            "radabelief turns it on"
        ),
        "degenerated_to_sgd": (
            "with rectify, take momentum-SGD steps in the first steps, where the rectification "
            "is undefined; false skips those updates"
        ),
    },
    "adadelta": {
        "lr": (
            "factor on Adadelta's update before it is applied (1.0 is the method as published); the schedule "
            "multiplies it"
        ),
        "rho": "decay rate of the running averages of squared gradients and of squared updates (higher: smoother)",
        "eps": "constant added inside both square roots, which also sets the size of the first steps",
        "weight_decay": WD_L2,
    },
    "adafactor": {
        "lr": (
            "learning rate the schedule multiplies; null (adafactor's default) means Adafactor's own relative "
            "step size min(1e-2, 1 / sqrt(step)), which a schedule cannot scale: set a number with a schedule"
        ),
        "eps": "constant added to the squared gradient before it is averaged",
        "eps_scale": (
            f"floor on the weights' RMS that scale_parameter multiplies the relative step by {_ADAFACTOR_NULL_LR}"
        ),
        "clip_threshold": "cap on the RMS of each tensor's update: it is divided by max(1, RMS / clip_threshold)",
        "decay_rate": (
            "exponent of the second moment's decay: beta2 at step t is 1 - t^decay_rate (negative, so "
            "the average remembers more steps as training goes on)"
        ),
        "betas": (
            "only beta1 counts: the decay rate of a momentum average of the update; null (adafactor's "
            "default) keeps none and saves its memory; decay_rate sets the second moment's decay"
        ),
        "weight_decay": (
            "decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay (the "
            "relative step size with lr null); 0 for none"
        ),
        "scale_parameter": (
            f"multiply the relative step size by the weights' RMS (at least eps_scale) {_ADAFACTOR_NULL_LR}"
        ),
        "warmup_init": (
            f"start the relative step size at 1e-6 * step, growing, instead of 1e-2 "
            f"{_ADAFACTOR_NULL_LR}: a set lr refuses it"
        ),
        "min_dim_size_to_factor": (
            "the second moment is kept as row and column averages when two dims (a conv's "
            "out and in channels, else the last two) both exceed this size; in full otherwise"
        ),
        "caution": "cautious update of the momentum (needs betas): " + CAUTION.split(": ", 1)[1],
    },
    "adafactorbv": {
        "min_dim_size_to_factor": (
            "the second moment is kept as averages over the two largest dims when the "
            "smaller of them is at least this size; in full otherwise"
        ),
        "decay_rate": (
            "beta2 at step t is min(beta2_cap, 1 - t^-decay_rate), t counted from decay_offset: higher "
            "values lengthen the second moment's memory sooner"
        ),
        "decay_offset": "steps by which the beta2 schedule's clock is held back (it counts at least 1); 0 for none",
        "beta2_cap": "upper limit of the scheduled beta2, the second moment's decay rate",
        "momentum": (
            "decay rate of the momentum average of the normalized update, stored in bfloat16; null keeps "
            "no momentum (less memory)"
        ),
        "eps": "constant added to the squared gradient before averaging; null: 1e-30 (1e-7 for float16 gradients)",
        "weight_decay": (
            "decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay (by "
            "1 - weight_decay with unscaled_wd); 0 for none"
        ),
        "clipping_threshold": (
            "cap on the RMS of each tensor's normalized update, before momentum: it is divided "
            "by max(1, RMS / clipping_threshold); null for none"
        ),
        "unscaled_wd": "big_vision's decay: shrink the weights by weight_decay per step, not by lr * weight_decay",
        "caution": "cautious update of the momentum (needs momentum): " + CAUTION.split(": ", 1)[1],
        "corrected_weight_decay": (
            "scale the weight decay by lr_t^2 / lr instead of lr_t (lr_t: the scheduled "
            "rate), or by lr_t / lr instead of 1 with unscaled_wd"
        ),
    },
    "adagrad": {
        "lr_decay": "the step size is lr / (1 + (step - 1) * lr_decay), besides the schedule; 0 for none",
        "initial_accumulator_value": (
            "starting value of each parameter's sum of squared gradients (larger: smaller, steadier first steps)"
        ),
        "eps": "constant added to the root of the squared-gradient sum in the denominator",
        "weight_decay": WD_L2,
    },
    "adamax": {
        "betas": (
            "(beta1, beta2): decay rate of the gradient's running average, and of the infinity norm "
            "max(beta2 * norm, |gradient| + eps) that divides it"
        ),
        "eps": "constant added to |gradient| in the infinity norm, so that the divisor is never 0",
        "weight_decay": WD_L2,
    },
    "adamp": {
        **_PROJECTION,
        "eps": "constant added to Adam's denominator and to the norms of the projection test",
        "weight_decay": (
            "decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay "
            "(times wd_ratio for projected weights); 0 for none"
        ),
        "nesterov": "Nesterov-style step: beta1 * average + (1 - beta1) * gradient in place of the average",
    },
    "adan": {
        "betas": (
            "(beta1, beta2, beta3): decay rates of the gradient's average, of the average of the change of "
            "the gradient between steps, and of the squared (change-corrected) gradient's average"
        ),
        "weight_decay": (
            "decoupled weight decay: with no_prox the weights are multiplied by 1 - lr * weight_decay "
            "before the step, else divided by 1 + lr * weight_decay after it (proximal); 0 for none"
        ),
        "no_prox": (
            "decay the weights AdamW-style (times 1 - lr * weight_decay) instead of Adan's proximal "
            "division by 1 + lr * weight_decay"
        ),
    },
    "adopt": {
        "betas": (
            "(beta1, beta2): decay rates of the momentum of the normalized gradient and of the squared-"
            "gradient average that normalizes it (updated after use, so any beta2 converges)"
        ),
        "eps": "floor on the root of the squared-gradient average that divides the gradient (a minimum, not a sum)",
        "clip_exp": "the normalized gradient is clipped to +/-(step - 1)^clip_exp, a bound that widens; null for none",
    },
    "lamb": {
        "bias_correction": "divide the moment averages by 1 - beta^step (Adam's bias correction); false uses them raw",
        "weight_decay": (
            "weight decay strength: with decoupled_decay the weights shrink by lr * weight_decay each "
            "step, else weight_decay * weights joins the Adam-style update before the trust ratio; "
            "0 for none (which also skips the trust ratio unless always_adapt)"
        ),
        "max_grad_norm": "all gradients are scaled down together when their global norm exceeds this; null for none",
        "trust_clip": "LAMBC: cap the trust ratio ||weights|| / ||update|| at 1, so no tensor steps more than lr",
        "decoupled_decay": (
            "decay the weights directly (times 1 - lr * weight_decay each step) instead of adding "
            "weight_decay * weights to the update before the trust ratio"
        ),
    },
    "laprop": {
        "betas": (
            "(beta1, beta2): decay rates of the momentum of the normalized gradient (gradient / root of its "
            "squared average) and of that squared-gradient average"
        ),
    },
    "lars": {
        "weight_decay": (
            "L2 penalty: weight_decay * weights is added to the gradient before the trust-ratio "
            "scaling; 0 for none (which also skips the trust ratio unless always_adapt)"
        ),
        "trust_coeff": (
            "LARS trust coefficient: each tensor's gradient is scaled by trust_coeff * ||w|| / (||g|| + "
            "weight_decay * ||w|| + eps)"
        ),
        "eps": "constant added to the trust ratio's denominator",
        "trust_clip": "LARC: a tensor's effective rate is min(trust ratio, lr) instead of lr * trust ratio",
    },
    "lion": {
        "lr": (
            "base learning rate: each weight moves by lr times a sign, so it is usually 3-10x smaller than "
            "AdamW's; the schedule multiplies it"
        ),
        "betas": (
            "(beta1, beta2): beta1 mixes momentum and gradient into the update whose sign is taken; beta2 is "
            "the decay rate of the momentum kept between steps"
        ),
    },
    "madgrad": {
        "momentum": (
            "the weights become momentum * weights + (1 - momentum) * the dual-averaging point each step; "
            "0 jumps to that point"
        ),
        "eps": "constant added to the cube root of the accumulated squared gradients (and to lr)",
    },
    "mars": {
        "betas": (
            "(beta1, beta2): decay rates of the averages of the variance-reduced gradient and of its square "
            "(beta1 also weighs the correction)"
        ),
        "gamma": (
            "weight of the variance reduction: the gradient g becomes g + gamma * beta1 / (1 - beta1) * (g - "
            "previous g), then is clipped to norm 1"
        ),
        "mars_type": "what steps on the corrected gradient: 'adamw' (its Adam-normalized average) or 'lion' (a sign)",
        "optimize_1d": "apply MARS to 1-D parameters (biases, norms) too; false steps them with plain AdamW",
        "lr_1d_factor": "factor on lr for the 1-D parameters AdamW steps (without optimize_1d)",
        "betas_1d": "betas of the AdamW that steps 1-D parameters (without optimize_1d); null: betas",
    },
    "muon": {
        "lr": (
            "base learning rate of the orthogonalized matrix updates (scaled per shape by adjust_lr_fn); the "
            "AdamW fallback takes lr * fallback_lr_scale; the schedule multiplies both"
        ),
        "weight_decay": (
            "decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay (the "
            "fallback's lr for fallback parameters); 0 for none"
        ),
        "momentum": "decay rate of the gradient's running average that is orthogonalized",
        "nesterov": (
            "orthogonalize gradient + momentum * (buffer - gradient) instead of the buffer; the fallback becomes NAdamW"
        ),
        "ns_steps": "Newton-Schulz iterations that orthogonalize the update (more: closer to orthogonal, slower)",
        "ns_coefficients": (
            "coefficients of the Newton-Schulz iterations: 'quintic', 'original', 'polar_express' "
            "or 'polar_express_safer'"
        ),
        "eps": (
            "floor on the update's norm when it is normalized for Newton-Schulz (added with scale_eps); also the "
            "eps of AdaMuon's and the fallback's denominators"
        ),
        "safety_factor": (
            "the update is divided by safety_factor times its norm before Newton-Schulz (e.g. 1.01 "
            "keeps its spectral norm safely below 1)"
        ),
        "adjust_lr_fn": (
            "per-shape lr scale of a matrix: 'match_rms_adamw' (an AdamW-like update RMS of 0.2), "
            "'rms_to_rms' (sqrt(out / in)), 'original' (muon only: sqrt(max(1, out / in))), "
            "'rsqrt_in' (adamuon only: 1 / sqrt(in)); null for none"
        ),
        "conv_mode": (
            "how a conv kernel becomes a matrix: 'flatten' to (out, in * kernel size), or 'batched', each "
            "kernel position's (out, in) slice orthogonalized alone"
        ),
        "normalize_spatial": "in conv_mode 'batched', divide the lr scale by sqrt(kernel positions)",
        "adamw_lr": "deprecated: the fallback's own lr (sets fallback_lr_scale to adamw_lr / lr); null: unused",
        "fallback_lr_scale": (
            "factor on lr for the parameters stepped by the AdamW fallback (1-D, depthwise, extreme shapes)"
        ),
        "betas": "(beta1, beta2) of the AdamW fallback; beta2 is also AdaMuon's second-moment decay rate",
        "algo": (
            "'muon' (orthogonalized momentum) or 'adamuon' (the orthogonalized update also divided by a running "
            "second moment, arXiv 2507.11005)"
        ),
        "scale_eps": "scale eps by sqrt(in / out) per matrix and add it to the norm, not floor it (muP-style damping)",
    },
    "nadam": {
        "momentum_decay": ("NAdam's momentum warmup: beta1 at step t is scaled by 1 - 0.5 * 0.96^(t * momentum_decay)"),
    },
    "nadamlegacy": {
        "schedule_decay": "momentum warmup: the momentum at step t is beta1 * (1 - 0.5 * 0.96^(t * schedule_decay))",
        "weight_decay": WD_L2,
    },
    "novograd": {
        "betas": (
            "(beta1, beta2): decay rate of the momentum of the normalized gradient, and of each tensor's "
            "running average of its squared gradient norm (one number per tensor)"
        ),
        "eps": "constant added to the root of the squared-norm average that divides each tensor's gradient",
        "weight_decay": (
            "weight decay strength: with decoupled_decay the weights shrink by lr * weight_decay each "
            "step, else weight_decay * weights is added to the normalized gradient (as in the paper); "
            "0 for none"
        ),
        "amsgrad": "divide by the running maximum of the squared-norm average instead of its current value",
        "decoupled_decay": (
            "decay the weights directly (times 1 - lr * weight_decay each step) instead of adding "
            "weight_decay * weights to the normalized gradient"
        ),
    },
    "rmsprop": {
        "alpha": "decay rate of the squared-gradient running average (avg = alpha * avg + (1 - alpha) * gradient^2)",
        "eps": "constant added to the root of that average in the denominator",
        "momentum": "momentum of the normalized step: buffer = momentum * buffer + gradient / root(avg); 0 for none",
        "weight_decay": WD_L2,
    },
    "rmsproptf": {
        "alpha": (
            "decay rate of the squared-gradient running average (avg = alpha * avg + (1 - alpha) * "
            "gradient^2), which starts at 1 as in TensorFlow"
        ),
        "eps": "constant added inside the square root (TensorFlow style), so it weighs more than torch RMSprop's",
        "momentum": (
            "momentum of the normalized step: buffer = momentum * buffer + lr * gradient / root(avg) (lr "
            "applied later without lr_in_momentum); 0 for none"
        ),
        "lr_in_momentum": (
            "fold the learning rate into the momentum buffer (TensorFlow), so a change of lr acts "
            "gradually; false multiplies the buffer by lr when stepping (torch)"
        ),
        "caution": "cautious update of the momentum buffer (needs momentum): " + CAUTION.split(": ", 1)[1],
    },
    "sgdp": {
        **_PROJECTION,
        "eps": "constant that keeps the cosine and weight-norm divisions of the projection finite",
        "weight_decay": (
            "decoupled weight decay: each step multiplies the weights by 1 - lr * weight_decay / "
            "(1 - momentum) (times wd_ratio for projected weights); 0 for none"
        ),
    },
}


def meanings(timm_name: str, parameters: Iterable[str]) -> dict[str, str]:
    """``{parameter: meaning}`` for one of timm's optimizers; a parameter nothing here names is left out."""
    parameters = list(parameters)
    own = OWN.get(FAMILY_OF.get(timm_name, ""), {})
    out = {}
    for name in parameters:
        meaning = own.get(name) or (_switched_decay(parameters) if name == "weight_decay" else None)
        meaning = meaning or SHARED.get(name)
        if meaning:
            out[name] = meaning
    return out


def _switched_decay(parameters: list[str]) -> str | None:
    """``weight_decay``'s meaning where a switch chooses between decoupled decay and an L2 term."""
    switch = next((s for s in SWITCHES if s in parameters), None)
    if switch is None:
        return None
    return (
        f"weight decay strength: with {switch} the weights shrink by lr * weight_decay each step (decoupled), "
        f"else weight_decay * weights is added to the gradient (L2); 0 for none"
    )


def args_section(timm_name: str, parameters: Iterable[str]) -> str:
    """The Google-style ``Args:`` section of a factory's docstring (:mod:`dlrecipes.core.param_docs` reads it)."""
    lines = [f"    {name}: {meaning}" for name, meaning in meanings(timm_name, parameters).items()]
    return "Args:\n" + "\n".join(lines) if lines else ""
