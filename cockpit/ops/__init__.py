"""DeepSpeed's compiled ops: which a run needs, where this environment builds them, whether they are
built, their build lock; shared by the trainer's build phase, the doctor and the supervisor."""
