"""What counts as a secret, and how it is hidden wherever requests, plans, settings or logs are
shown. One home, so the CLIs, the manifests and the server's logged settings agree."""
from __future__ import annotations

import re
from typing import Any

# Names whose values are secrets wherever they appear (env maps, headers, parameters).
_SECRET_NAME = re.compile(r"(TOKEN(?!S|IZE|_ID)|SECRET|PASSWORD|PASSWD|API[_-]?KEY|ACCESS[_-]?KEY|CREDENTIAL|PRIVATE_KEY)",
                          re.IGNORECASE)
# Names that point at a secret rather than hold one (Kubernetes `secretKeyRef`, `secretName`,
# an ARN in Secrets Manager): their values are safe to show.
_REFERENCE_NAME = re.compile(r"(Ref|Name|Arn|_ARN)$")
MASK = "****"


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name)) and not _REFERENCE_NAME.search(name)


def mask_secrets(obj: Any) -> Any:
    """A copy of ``obj`` with the values of secret-named keys replaced by ``****``."""
    if isinstance(obj, dict):
        return {k: (MASK if isinstance(k, str) and is_secret_name(k) and v not in (None, "")
                    else mask_secrets(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_secrets(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(mask_secrets(v) for v in obj)
    return obj


def mask_secrets_text(text: str) -> str:
    """``KEY=value`` lines (serving.properties, env files) with secret values masked."""
    out = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        out.append(f"{key}={MASK}" if sep and is_secret_name(key.strip()) and value else line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")
