-- Reserved: the number of a version another branch adds (the lead
-- replaces this file with it when merging).
SELECT 1
