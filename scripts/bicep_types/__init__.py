"""Check the resource declarations of infra/azure/ against Azure's published Bicep type definitions.

`bicep` reads the declarations (with pycep's grammar), `definitions` reads the committed subset of
Azure/bicep-types-az, `check` compares the two, `extract` regenerates the subset from a snapshot.
"""
