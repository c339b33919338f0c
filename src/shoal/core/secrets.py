"""Which environment variables hold secrets, and how they are shown: ``****``.

The implementation lives in ``shoal._internal.secrets`` (standard library only, so a job's
own interpreter can import it without the rest of ``shoal.core``).
"""

from shoal._internal.secrets import (
    JOB_SECRETS_VAR,
    MASK,
    StreamRedactor,
    is_secret_name,
    mask_env,
    mask_text,
    secret_values,
    without_credentials,
)

__all__ = ["JOB_SECRETS_VAR", "MASK", "StreamRedactor", "is_secret_name", "mask_env",
           "mask_text", "secret_values", "without_credentials"]
