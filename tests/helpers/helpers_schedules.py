"""The post's GPipe and 1F1B slot tables (4 GPUs, 4 micro-batches), slot by slot: the schedule tests, the
pipeline lessons' tests and the app's tests all hold what they show against these."""

POST_GPIPE = ["F1 F2 F3 F4 . . . . . . B4 B3 B2 B1",
              ". F1 F2 F3 F4 . . . . B4 B3 B2 B1 .",
              ". . F1 F2 F3 F4 . . B4 B3 B2 B1 . .",
              ". . . F1 F2 F3 F4 B4 B3 B2 B1 . . ."]
POST_1F1B = ["F1 F2 F3 F4 . . . B1 . B2 . B3 . B4",
             ". F1 F2 F3 . . B1 F4 B2 . B3 . B4 .",
             ". . F1 F2 . B1 F3 B2 F4 B3 . B4 . .",
             ". . . F1 B1 F2 B2 F3 B3 F4 B4 . . ."]
