"""What a user may write to name sites, checked before anything runs: `layers_to_save`
entries, `intervene` pairs and `stop_after`."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.interventions.actions import Action, as_action
from torchlog.sites.select import Selector

__all__ = ["SELECTION_FORMS", "SITE_FORMS", "Site", "check_entries", "check_intervene", "check_site",
           "check_stop_after"]

SELECTION_FORMS = (
    "'all', None, or a list mixing layer labels ('conv2d_3_7', 'linear_1_1:2'), module "
    "addresses ('features'), int positions (-5), substrings of labels ('conv') and "
    "torchlog.select selectors (select.func('relu') & select.in_module('features'))"
)


def check_entries(layers_to_save: object) -> list[int | str] | None:
    """Validate the shape of `layers_to_save` before any forward pass.

    Returns None for 'all', an empty list for None (save nothing), else the entries.

    Raises:
        InvalidArgumentTypeError: not a str, int, list or tuple, or an entry of another type.
        InvalidOptionError: an empty list.
    """
    if isinstance(layers_to_save, str) and layers_to_save == "all":
        return None
    if layers_to_save is None:
        return []
    if isinstance(layers_to_save, (str, int, Selector)) and not isinstance(layers_to_save, bool):
        layers_to_save = [layers_to_save]
    if not isinstance(layers_to_save, (list, tuple)):
        raise InvalidArgumentTypeError(
            f"layers_to_save={layers_to_save!r} is not accepted; use {SELECTION_FORMS}")
    if not layers_to_save:
        raise InvalidOptionError(
            "layers_to_save=[] selects nothing; pass None to save no activations or "
            f"use {SELECTION_FORMS}")
    for entry in layers_to_save:
        if isinstance(entry, Selector):
            continue
        if isinstance(entry, bool) or not isinstance(entry, (str, int)):
            raise InvalidArgumentTypeError(
                f"layers_to_save entry {entry!r} ({type(entry).__name__}) is not accepted; "
                f"entries are str or int: {SELECTION_FORMS}")
        if isinstance(entry, str) and not entry:
            raise InvalidOptionError(f"layers_to_save entry {entry!r} is empty; {SELECTION_FORMS}")
    return list(layers_to_save)


SITE_FORMS = ("a layer label ('relu_1_2', 'linear_1_1:2'), a module address ('features.6', "
               "'cell:3'), an int position (-5), or a torchlog.select selector "
               "(select.func('softmax') & select.in_module('h.1'))")


@dataclass(frozen=True, slots=True)
class Site:
    """One (site, action) pair of `intervene`, checked."""

    number: int  # its position in `intervene`
    given: Any  # the site as the user wrote it
    action: Action


def check_intervene(intervene: Any) -> tuple[Site, ...]:
    """The (site, action) pairs of `intervene` (a dict, or a list of pairs), in order, checked
    for type; () for None.

    Raises:
        InvalidArgumentTypeError: not a dict or list of pairs, a site or action of a wrong type.
        InvalidOptionError: an empty dict or list.
    """
    if intervene is None:
        return ()
    if isinstance(intervene, Mapping):
        pairs = list(intervene.items())
    elif isinstance(intervene, (list, tuple)):
        pairs = list(intervene)
        for pair in pairs:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise InvalidArgumentTypeError(
                    f"intervene as a list takes (site, action) pairs, got {pair!r}; or pass a dict "
                    "{site: action}")
    else:
        raise InvalidArgumentTypeError(
            f"intervene must be a dict {{site: action}} or a list of (site, action) pairs, got "
            f"{intervene!r} of type {type(intervene).__name__}")
    if not pairs:
        raise InvalidOptionError("intervene is empty; pass None for no interventions, or {site: action}")
    return tuple(Site(number, check_site(site, "intervene"), as_action(action, site))
                 for number, (site, action) in enumerate(pairs))


def check_stop_after(stop_after: Any) -> Any:
    """`stop_after` checked for type (a site as `intervene` takes them, or None).

    Raises:
        InvalidArgumentTypeError: any other type.
    """
    return None if stop_after is None else check_site(stop_after, "stop_after")


def check_site(site: Any, what: str) -> Any:
    """`site` when it is of a type a site may be (for `what`'s messages), else raise
    InvalidArgumentTypeError naming it and the forms a site takes."""
    if isinstance(site, Selector) or (isinstance(site, str) and site) or (
            isinstance(site, int) and not isinstance(site, bool)):
        return site
    raise InvalidArgumentTypeError(
        f"{what} site {site!r} of type {type(site).__name__} is not accepted; a site is {SITE_FORMS}")


