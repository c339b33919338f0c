"""The entry script of a ``FineTuner`` job: SageMaker's container layout in, a merged model out.

The job runs it as ``python finetune.py --base_model ... --method qlora ...`` from
``/opt/ml/code`` (the job directory's ``code/`` on shoal), so the container root is the
directory above this file.
"""

import sys
from pathlib import Path

from shoal.llm._job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], Path(__file__).resolve().parents[1]))
